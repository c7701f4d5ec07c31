"""Runtime of the ROCm vLLM image: the guard, the serve launcher, the self-test CLI and what they share.

Modules are named after what they do; the functional cores (device
listing parsing, guard decisions, serve arguments, report building, benchmark verdicts and ratios)
are pure functions, and each `main()` is a thin adapter around them.
"""
