"""Runtime of the ROCm vLLM image: the guard, the serve launcher and the self-test CLI.

guard (GPU, settings and AITER decisions before any command), serve (the vLLM server's
argv from SERVE_* settings), manifest (the image manifest), devices (amd-smi/rocminfo
listings), jitcache (the AITER JIT cache volume), versions (installed versions), report
and selftest (the `selftest` command: runs the pytest suites, writes JSON and JUnit),
bench and metrics (the serving benchmark client the bench suite uses).

Modules are named after what they do; the functional cores (device listing
parsing, guard decisions, serve arguments, report building, benchmark metrics)
are pure functions, and each `main()` is a thin adapter around them.
"""
