"""The decode-metadata step of vLLM's built-in ROCM_AITER_MLA backend, read from a release's
source at run time, for backend/bench/planning.py to time beside the plugin's planner.

vLLM's ``AiterMLAMetadataBuilder._build_decode`` (``vllm/v1/attention/backends/mla/
rocm_aiter_mla.py``) turns a decode batch's block table into AITER's flat page list in
three parts, on the GPU:

* ``kv_indptr``: a zero, then the prefix sum of the requests' lengths (padding rows of a
  padded multi-token batch, query length 0, get the batch's query length);
* under full CUDA graphs: ``fill_(-1)`` of its persistent ``paged_kv_indices`` buffer (sized
  ``max_num_seqs x max_model_len``: one page per token), then ``kv_indptr`` and ``qo_indptr``
  copied into persistent buffers, their tails set to the last value;
* a Triton kernel launched on ``(requests, chunks of the block table's width)`` that expands
  each request's block-table entries into its pages.

The kernel is not part of this repository: :func:`load` finds, in the release's file, the
Triton launch inside ``_build_decode``, takes the launched function's source text from the
file (``ast``), compiles it under the file's own name and line numbers and runs it in a
namespace holding ``triton``, ``tl`` and ``torch``. It also reads whether ``_build_decode``
fills the index buffer with -1 and which literal constants the launch passes (its chunk
size). The kernels of the releases read so far write slot ids (page size 1:
block-table entry ``b`` of block size ``K`` becomes ``b*K .. b*K+K-1``), the granularity of
the plugin's planner; a kernel without a ``KERNEL_BLOCK_SIZE`` parameter (pages of the block
size) is refused rather than compared with a plan of another unit.

The rest of the step (the prefix sum, the fill, the persistent copies) is a few PyTorch
calls, written here as :class:`BuiltinStep` after the release's code.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

SOURCE_FILE = Path("vllm/v1/attention/backends/mla/rocm_aiter_mla.py")
BUILDER = "AiterMLAMetadataBuilder"
METHOD = "_build_decode"

# What the step hands the kernel, by the kernel's parameter names. Parameters named neither
# here nor as literals at the launch take their defaults (the uniform decode path: no
# variable-length tail clamp, no start offsets).
_TENSOR_ARGS = ("page_indices", "block_table", "block_table_stride_0", "block_table_stride_1",
                "cu_num_tokens", "num_real_tokens", "KERNEL_BLOCK_SIZE")


class SourceError(Exception):
    """The release's file does not have the step this module knows how to run."""


@dataclass(frozen=True)
class Builtin:
    """One release's decode-metadata step: its label, its kernel and what it launches it with."""

    label: str  # "vLLM 0.33.0"
    path: Path
    kernel_name: str
    kernel: object  # triton JITFunction
    params: tuple[str, ...]
    launch_constants: dict  # literal keyword arguments of the launch (BLOCK_SIZE=1024)
    fills: bool  # _build_decode fills paged_kv_indices with -1 (under full CUDA graphs)

    @property
    def chunk(self) -> int:
        return int(self.launch_constants["BLOCK_SIZE"])


def source_file(path: Path) -> Path:
    """The rocm_aiter_mla.py of an unpacked sdist folder (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / SOURCE_FILE
    if not path.is_file():
        raise SourceError(f"{path}: no such file (give an unpacked vLLM sdist folder or its {SOURCE_FILE})")
    return path


def release_of(file: Path) -> str:
    """The vLLM release a rocm_aiter_mla.py belongs to: its sdist's PKG-INFO or vllm/_version.py
    (the folder above vllm/), else the name of that folder."""
    root = file.resolve().parents[len(SOURCE_FILE.parts) - 1]
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        found = re.search(r"^Version:\s*(\S+)", pkg_info.read_text(errors="replace"), re.M)
        if found:
            return found.group(1)
    version_py = root / "vllm" / "_version.py"
    if version_py.is_file():
        found = re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]", version_py.read_text(errors="replace"))
        if found:
            return found.group(1)
    return root.name


def _find(nodes, kind, name: str):
    return next((node for node in nodes if isinstance(node, kind) and node.name == name), None)


def _launches(method: ast.FunctionDef) -> list[ast.Call]:
    """Calls of the form ``name[grid](...)``: Triton launches."""
    return [node for node in ast.walk(method)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Name)]


def _fills_indices(method: ast.FunctionDef) -> bool:
    """Whether the method calls ``<...>.paged_kv_indices.fill_(-1)``."""
    for node in ast.walk(method):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fill_"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "paged_kv_indices"
                and len(node.args) == 1):
            try:
                if ast.literal_eval(node.args[0]) == -1:
                    return True
            except ValueError:
                continue
    return False


def _literal_keywords(call: ast.Call) -> dict:
    constants = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            continue
        try:
            constants[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            continue  # a variable: the step passes its own value or the default
    return constants


def load(path: Path) -> Builtin:
    """Read the decode-metadata step of the release at ``path`` (sdist folder or file)."""
    file = source_file(path)
    text = file.read_text()
    tree = ast.parse(text, filename=str(file))
    builder = _find(tree.body, ast.ClassDef, BUILDER)
    method = builder and _find(builder.body, ast.FunctionDef, METHOD)
    if method is None:
        raise SourceError(f"{file}: no {BUILDER}.{METHOD}")
    launches = _launches(method)
    names = sorted({call.func.value.id for call in launches})
    if len(names) != 1:
        raise SourceError(f"{file}: {METHOD} launches {names or 'no Triton kernel'}; expected one kernel")
    name = names[0]
    definition = _find(tree.body, ast.FunctionDef, name)
    if definition is None:
        raise SourceError(f"{file}: {METHOD} launches {name}, which the file does not define at module level")
    first = min([d.lineno for d in definition.decorator_list] + [definition.lineno])
    lines = text.splitlines(keepends=True)[first - 1:definition.end_lineno]
    # Blank lines before it keep the file's line numbers, so Triton (which reads a kernel's
    # source through inspect) and its error messages see the function where it stands.
    code = compile("\n" * (first - 1) + "".join(lines), str(file), "exec")
    release = release_of(file)
    namespace = {"__name__": f"vllm_{release.replace('.', '_')}_rocm_aiter_mla", "triton": triton, "tl": tl,
                 "torch": torch}
    exec(code, namespace)  # the release's own kernel, read from its file (see the module docstring)
    kernel = namespace[name]
    if not hasattr(kernel, "run") or not hasattr(kernel, "fn"):
        raise SourceError(f"{file}: {name} is not a Triton kernel (@triton.jit)")
    signature = inspect.signature(kernel.fn)
    params = tuple(signature.parameters)
    missing = {"page_indices", "block_table", "cu_num_tokens"} - set(params)
    if missing:
        raise SourceError(f"{file}: {name} takes no {sorted(missing)}: not the page-expanding kernel this bench "
                          "knows")
    if "KERNEL_BLOCK_SIZE" not in params:
        raise SourceError(f"{file}: {name} has no KERNEL_BLOCK_SIZE parameter, so it does not write slot ids "
                          "(page size 1); this bench compares slot-granular plans only")
    constants = _literal_keywords(launches[0])
    unknown = [p for p, spec in signature.parameters.items()
               if p not in _TENSOR_ARGS and p not in constants and spec.default is inspect.Parameter.empty]
    if unknown or "BLOCK_SIZE" not in constants:
        raise SourceError(f"{file}: {name} takes {unknown or 'no literal BLOCK_SIZE'}, "
                          "which this bench does not know how to pass")
    return Builtin(label=f"vLLM {release}", path=file, kernel_name=name, kernel=kernel, params=params,
                   launch_constants={k: v for k, v in constants.items() if k in params},
                   fills=_fills_indices(method))


class BuiltinStep:
    """The built-in's decode-metadata step for one batch, on persistent buffers sized as its
    builder sizes them (``max_num_seqs x max_model_len`` index entries).

    ``pad_rows``: the batch is a padded multi-token batch (query length > 1 and padding rows
    of query length 0), where the built-in gives the padding rows ``qlen`` keys; at query
    length 1 it leaves them at their length (0). ``full_graphs``: the step as it runs under
    full CUDA graphs (the fill and the persistent copies); without: the prefix sum and the
    kernel only."""

    def __init__(self, builtin: Builtin, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 query_start_loc: torch.Tensor, qlen: int, block_size: int, pad_rows: bool,
                 indices: torch.Tensor, max_num_seqs: int):
        self.builtin = builtin
        self.table, self.seq, self.qsl = block_table, seq_lens, query_start_loc
        self.qlen, self.pad_rows = qlen, pad_rows
        self.num_reqs = block_table.shape[0]
        self.indices = indices
        device = block_table.device
        self.kv_indptr_buf = torch.zeros(max_num_seqs + 1, dtype=torch.int32, device=device)
        self.qo_indptr_buf = torch.zeros(max_num_seqs + 1, dtype=torch.int32, device=device)
        width_keys = block_table.shape[1] * block_size
        self.grid = (self.num_reqs, max(1, -(-width_keys // builtin.chunk)))
        fixed = {"page_indices": indices, "block_table": block_table,
                 "block_table_stride_0": block_table.stride(0), "block_table_stride_1": block_table.stride(1),
                 "num_real_tokens": seq_lens, "KERNEL_BLOCK_SIZE": block_size, **builtin.launch_constants}
        self.kernel_args = {k: v for k, v in fixed.items() if k in builtin.params}

    def lengths(self) -> torch.Tensor:
        """The keys per request the step plans (device)."""
        if not self.pad_rows:
            return self.seq
        n = self.num_reqs
        qo_lens = (self.qsl[1:n + 1] - self.qsl[:n]).to(torch.int32)
        return torch.where(qo_lens > 0, self.seq, self.seq.new_full((), self.qlen))

    def __call__(self, full_graphs: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One step; returns (kv_indptr, the index buffer)."""
        n = self.num_reqs
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int32, device=self.seq.device),
                               self.lengths().cumsum(0, dtype=torch.int32)])
        if full_graphs and self.builtin.fills:
            self.indices.fill_(-1)
        self.builtin.kernel[self.grid](cu_num_tokens=kv_indptr, **self.kernel_args)
        if not full_graphs:
            return kv_indptr, self.indices
        self.kv_indptr_buf[:n + 1].copy_(kv_indptr, non_blocking=True)
        self.kv_indptr_buf[n + 1:].fill_(kv_indptr[-1])
        if self.pad_rows:
            qo_indptr = torch.arange(0, (n + 1) * self.qlen, self.qlen, dtype=torch.int32, device=self.seq.device)
        else:
            qo_indptr = self.qsl[:n + 1]
        self.qo_indptr_buf[:n + 1].copy_(qo_indptr, non_blocking=True)
        self.qo_indptr_buf[n + 1:] = qo_indptr[-1]
        return self.kv_indptr_buf[:n + 1], self.indices
