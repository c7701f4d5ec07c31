"""Runtime of the ROCm vLLM image: the guard, the serve launcher and the self-test CLI.

guard (GPU, settings and AITER decisions before any command), serve (the vLLM server's
argv from SERVE_* settings), manifest (the image manifest), devices (amd-smi/rocminfo
listings), jitcache (the AITER JIT cache volume), versions (installed versions), report
and selftest (the `selftest` command: runs the pytest suites, writes JSON and JUnit),
bench (the serving benchmark of attention backends side by side, measured by `vllm bench
serve`; the bench suite uses it), ray_cluster (Ray cluster membership of the multi-host
deployments: compose.ray.yaml's node script and the Kubernetes LeaderWorkerSet).

Modules are named after what they do; the functional cores (device listing
parsing, guard decisions, serve arguments, report building, benchmark verdicts and ratios)
are pure functions, and each `main()` is a thin adapter around them.
"""
