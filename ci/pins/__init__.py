"""Pin tooling for versions.json: `python3 -m ci.pins verify|resolve|args|...`.

A project of its own (pyproject.toml, uv.lock beside this file) whose dependencies include the runtime
package (rocm_vllm_runtime): run it with `uv run --locked --project ci/pins python -m ci.pins ...`,
or with a Python that has them (the test environment).
"""
