"""The record of a layer's first measurement (made in a child process, ``crash_safe``), kept in a
persistent folder so that a later start reads it instead of measuring in a child again.

A record is one JSON file per **identity**: the GPU (its architecture and name), the calls (heads,
query lengths, dtypes), the remedy's split count and the kernels (the factory the child loads them
with and ``AITER_MLA_KERNELS``). Its name is a digest of the identity; inside it holds the identity
itself, the **builds** it was measured with (the distributions of AITER, whichever provides the
``aiter`` package, and of vLLM, each with a digest of the files it installed; PyTorch; Triton; this
package's version and a digest of its source), the time limit it ran under, and each task's outcome
(``measure.measured_data``) for AITER's calls and the remedy's.

A record is trusted only when all of it checks out; otherwise the calls are measured again and the
record replaced:

* **unreadable** or **malformed**: not a regular file, not JSON, another shape, an unknown outcome,
  a task missing (a file cut short or left half-written by a run that crashed reads so too: records
  are written whole, through ``rocm_vllm_runtime.files.write_text``, so only another writer leaves one);
* **foreign**: its identity is not this one (a file copied or renamed into the folder);
* **stale**: another format, builds that differ (an image with another AITER, vLLM, PyTorch, Triton
  or plugin), or a call that passed a time limit shorter than today's.

Reading goes through ``files.read_json`` and ``schema.check`` (the project's one JSON reader and one
shape check), writing through ``files.write_text`` (atomic).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from . import __version__, measure
from .kernels import kernel_mode
from .measure_child import KINDS, Task, call_text

FORMAT = 1
RECORD_LIMIT = 1 << 20  # bytes: a record is a few KiB
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "triton-rocm")

_TEXTS = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 400}}
SCHEMA = {
    "type": "object",
    "required": ["format", "identity", "builds", "timeout_s", "measured"],
    "additionalProperties": False,
    "properties": {
        "format": {"type": "integer"},
        "identity": {"type": "object"},
        "builds": _TEXTS,
        "timeout_s": {"type": "number", "minimum": 0},
        "measured": {
            "type": "object",
            "required": list(KINDS),
            "additionalProperties": False,
            "properties": {kind: {"type": "object", "additionalProperties": {"type": "object"}} for kind in KINDS},
        },
    },
}


def gpu_of(device: torch.device) -> str:
    """The GPU a measurement ran on, as a record names it: architecture and product name (ROCm:
    ``gfx942:sramecc+:xnack- AMD Instinct MI300X``); ``cpu`` on the CPU."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
    return f"{arch} {props.name}"


def identity(gpu: str, calls: Sequence[measure.DecodeCall], splits: int, factory: str) -> dict[str, object]:
    """What a record is about."""
    return {"gpu": gpu, "calls": [call_text(c) for c in calls], "splits": splits, "factory": factory,
            "kernels": kernel_mode()}


def source_digest() -> str:
    """A digest of this package's Python source: a change to how calls are measured makes records stale."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def builds() -> dict[str, str]:
    """What the measured kernels and the measurement are built from, in this environment (read once per
    process: the installed distributions' metadata)."""
    from rocm_vllm_runtime.distributions import VLLM_DISTRIBUTIONS, build_of, version_of  # noqa: PLC0415

    torch_build = torch.__version__ + "".join(f" {name} {v}" for name in ("hip", "cuda")
                                              if (v := getattr(torch.version, name, None)))
    return {
        "aiter": aiter_build(),
        "vllm": build_of(*VLLM_DISTRIBUTIONS) or "not installed",
        "torch": torch_build,
        "triton": version_of(*TRITON_DISTRIBUTIONS) or "not installed",
        "plugin": f"{__version__} {source_digest()}",
    }


def aiter_build() -> str:
    """AITER's distribution as ``build_of`` names it, or "not installed": looked up by the names its
    wheels have, else by the distributions that provide the ``aiter`` package (whatever the wheel is
    named), a scan of every installed distribution's file list that is only made where ``aiter`` can
    be imported at all (a scan takes a few tenths of a second in a large environment, on every start)."""
    from rocm_vllm_runtime.distributions import AITER_DISTRIBUTIONS, build_of, providers_of  # noqa: PLC0415

    found = build_of(*AITER_DISTRIBUTIONS)
    if found is None and _importable("aiter"):
        found = build_of(*providers_of("aiter"))
    return found or "not installed"


def _importable(name: str) -> bool:
    """Whether the top-level package ``name`` can be found on the import path (nothing is imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def path_in(folder: Path, ident: dict[str, object]) -> Path:
    """The record's file for ``ident`` in ``folder``."""
    from rocm_vllm_runtime import files  # noqa: PLC0415  (crash_safe says where it comes from)

    text = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return files.inside(folder, f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json", "a record's name")


def text_of(ident: dict[str, object], builds_: dict[str, str], timeout_s: float,
            measured: dict[Task, measure.Measured]) -> str:
    body = {"format": FORMAT, "identity": ident, "builds": builds_, "timeout_s": timeout_s,
            "measured": {kind: {str(q): measure.measured_data(m) for (k, q), m in sorted(measured.items()) if k == kind}
                         for kind in KINDS}}
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def write(path: Path, ident: dict[str, object], builds_: dict[str, str], timeout_s: float,
          measured: dict[Task, measure.Measured]) -> None:
    """Write the record whole (or not at all)."""
    from rocm_vllm_runtime import files  # noqa: PLC0415

    files.make_dir(path.parent)
    files.write_text(path, text_of(ident, builds_, timeout_s, measured))


def read(path: Path, ident: dict[str, object], builds_: dict[str, str], qlens: Sequence[int],
         timeout_s: float) -> tuple[dict[Task, measure.Measured] | None, str]:
    """(each task's recorded outcome, "") where the record at ``path`` can be trusted; else (None, why
    not, in a few words; "" where there is none)."""
    from rocm_vllm_runtime import files, schema  # noqa: PLC0415

    if not path.exists() and not path.is_symlink():
        return None, ""
    try:
        data = schema.check(files.read_json(path, str(path), RECORD_LIMIT), SCHEMA, str(path))
    except files.DataError as exc:
        return None, f"malformed ({exc.detail})"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if data["format"] != FORMAT:
        return None, f"stale (format {data['format']}, this plugin writes {FORMAT})"
    if data["identity"] != ident:
        return None, "foreign (it is about another GPU, calls or kernels than its name says)"
    changed = sorted(name for name in set(builds_) | set(data["builds"])
                     if data["builds"].get(name) != builds_.get(name))
    if changed:
        return None, f"stale (measured with another {', '.join(changed)})"
    found: dict[Task, measure.Measured] = {}
    for kind in KINDS:
        if set(data["measured"][kind]) != {str(q) for q in qlens}:
            return None, f"malformed (its {kind} query lengths are not {', '.join(map(str, qlens))})"
        for q in qlens:
            try:
                found[kind, q] = measure.measured_from(data["measured"][kind][str(q)])
            except ValueError as exc:
                return None, f"malformed ({kind} at query length {q}: {exc})"
    limit = float(data["timeout_s"])
    if not math.isfinite(limit):
        return None, "malformed (its time limit is not a number)"
    if limit < timeout_s and any(m.outcome is measure.Outcome.TIMED_OUT for m in found.values()):
        return None, f"stale (a call passed its time limit of {limit:g} s, now {timeout_s:g} s)"
    return found, ""
