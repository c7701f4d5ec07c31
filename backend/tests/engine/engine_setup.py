"""How the engine tests start vLLM on CPU: the same selection on every CPU model."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FAKE_AMX_HOOK = REPO / "tests" / "fake_amx"
CPU_MLA_IMPL = "vllm.v1.attention.backends.mla.cpu_mla.CPUMLAImpl"
OUR_CPU_DEV_IMPL = "vllm_aiter_mla.cpu_dev.CPUDevMLAImpl"
AMX_MLA_BACKEND = "vllm.v1.attention.backends.mla.amx_mla.AMXMLABackend"


def engine_env(**extra: str) -> dict[str, str]:
    """Environment of every vLLM engine these tests start: no AITER_MLA_* of the caller, and
    vLLM's CPU platform told the CPU has AMX tiles (tests/fake_amx), so backend selection is
    that of an AMX machine on every CI machine; the tests name CPU_MLA explicitly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_MLA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAKE_AMX_HOOK), env.get("PYTHONPATH", "")) if p)
    env["ROCM_VLLM_FAKE_AMX"] = "1"
    env.update(extra)
    return env


VERSIONS_JSON = REPO / "versions.json"
NOT_YET_RELEASED_AITER = "0.1.99"


def default_track_aiter() -> str:
    """The AITER version of the default track (its aiter pin's tag)."""
    data = json.loads(VERSIONS_JSON.read_text())
    return data["tracks"][data["default_track"]]["aiter"].removeprefix("v")


@dataclass(frozen=True)
class Run:
    """One engine run: a backend serving a schedule of requests on the tiny model."""

    backend: str  # ours (this package's CPU development mode) | cpu_mla (vLLM's own)
    dtype: str = "float32"
    fault: str = "none"
    schedule: str = "waves"
    heads: int = 16  # attention heads of the tiny model
    # the AITER distribution installed in the engine's process (package metadata only: the CPU
    # development mode imports no AITER); this package's runs see the default track's, as in the image
    aiter: str | None = None
    # stand-ins for AITER's decode and vLLM's Triton decode (engine_kernels.SETS); None: the reference
    # kernel, and vLLM's Triton decode as it loads (on the CPU it cannot run: measured as raising)
    kernels: str | None = None

    @property
    def name(self) -> str:
        return "-".join(str(v) for v in asdict(self).values() if v is not None)


def our_run(**settings) -> Run:
    return Run("ours", **{"aiter": default_track_aiter(), **settings})


RUNS = (
    our_run(), Run("cpu_mla"),
    our_run(dtype="bfloat16"), Run("cpu_mla", dtype="bfloat16"),
    our_run(fault="last-slot-off-by-one"),
    our_run(schedule="sequential"),
    our_run(schedule="shared-prefix"), Run("cpu_mla", schedule="shared-prefix"),
    our_run(heads=8), Run("cpu_mla", heads=8),
    our_run(aiter=NOT_YET_RELEASED_AITER),
    # the start-up measurement's outcomes in the engine: AITER's call wrong and served by the remedy;
    # both wrong, the start refused (last: its engine never finishes starting)
    our_run(kernels="aiter-x0.97"),
    # two tensor-parallel ranks whose AITER stand-ins end their measurement child (SIGABRT) and hang in
    # it: both must start on the remedy (two worker processes, two measurement children and a wait of
    # the children's time limit: the costliest engine of the set)
    our_run(kernels="aborts|hangs", schedule="brief"),
    our_run(kernels="both-x0.97"),
)
TP_RUN = RUNS[-2]
