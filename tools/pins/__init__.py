"""Pin tooling for versions.json: `python3 -m tools.pins verify|resolve|args|...`.

Part of the tools' project (tools/pyproject.toml, tools/uv.lock), whose dependencies include the runtime
package (rocm_vllm_runtime): run it with `uv run --locked --project tools python -m tools.pins ...`,
or with a Python that has them (the test environment).
"""
