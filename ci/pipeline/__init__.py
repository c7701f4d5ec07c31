"""The CI pipeline's Python, run as `python3 -m ci.pipeline`: the self-test summary table (summary.py) and
what publishing decides (publish.py). It imports the runtime package (rocm_vllm_runtime): run it under
`uv run --locked --project tools` or in the test environment, which have it."""
