"""The self-test suites: a package, so that they import their helpers (rocm_fake) relatively,
in this repository and in the image alike."""
