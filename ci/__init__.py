"""The CI pipeline's package (`python3 -m ci.pipeline`, `from ci.pipeline import ...`). A regular package,
not a namespace one: an installed distribution with a top-level `ci` would otherwise take its place."""
