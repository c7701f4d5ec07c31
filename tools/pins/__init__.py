"""Pin tooling for versions.json: `python3 -m tools.pins verify|resolve|args|...`.

A project of its own (pyproject.toml, uv.lock beside this file) whose dependencies include the runtime
package (rocm_vllm_runtime): run it with `uv run --locked --project tools/pins python -m tools.pins ...`,
or with a Python that has them (the test environment).
"""
