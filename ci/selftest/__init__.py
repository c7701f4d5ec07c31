"""In-image self-tests and the runtime guard of the ROCm vLLM image.

Modules are named after what they do; the functional cores (device listing
parsing, guard decisions, serve arguments, report building, benchmark metrics)
are pure functions, and each `main()` is a thin adapter around them.
"""
