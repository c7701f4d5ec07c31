"""Parse GPU listings printed by `amd-smi` and `rocminfo` into GPU records.

Pure functions: text in, records out. Three formats are understood:

* `amd-smi static --asic` text (``GPU: 0`` blocks with ``TARGET_GRAPHICS_VERSION``),
* `amd-smi static --asic --json` (a list of GPUs, or ``{"gpu_data": [...]}``),
* `rocminfo` (``Agent N`` blocks; GPU agents carry ``Name: gfx942`` and an ISA
  ``Name: amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from . import files, numeric

ISA_PREFIX = "amdgcn-amd-amdhsa--"
_ARCH = re.compile(r"^gfx[0-9a-z]+$")


@dataclass(frozen=True)
class Gpu:
    index: int
    target: str  # full target id, e.g. "gfx942:sramecc+:xnack-" (features when known)
    name: str = ""  # marketing name when the listing has one

    @property
    def arch(self) -> str:
        return base_arch(self.target)


def base_arch(target: str) -> str:
    """`amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-` or `gfx942:xnack-` -> `gfx942`."""
    target = target.strip()
    if target.startswith(ISA_PREFIX):
        target = target[len(ISA_PREFIX):]
    return target.split(":", 1)[0].strip().lower()


def is_arch(text: str) -> bool:
    return bool(_ARCH.match(base_arch(text)))


def _arch_or_empty(target: str) -> str:
    return target if is_arch(target) else ""


def detect_format(text: str) -> str:
    """'amd-smi-json', 'amd-smi', 'rocminfo' or 'unknown'."""
    if text.strip().startswith(("[", "{")):
        return "amd-smi-json"
    if re.search(r"^\s*TARGET_GRAPHICS_VERSION\s*:|^GPU:\s*\d+\s*$", text, re.M):
        return "amd-smi"
    if re.search(r"^\s*(Agent \d+|Device Type:|Name:)", text, re.M):
        return "rocminfo"
    return "unknown"


def parse_listing(text: str) -> list[Gpu]:
    """GPUs in any supported listing; [] when the text lists none."""
    parse = {"amd-smi-json": parse_amd_smi_json, "amd-smi": parse_amd_smi, "rocminfo": parse_rocminfo}
    return parse.get(detect_format(text), lambda _: [])(text)


def _field(line: str) -> tuple[str, str] | None:
    if ":" not in line:
        return None
    key, value = line.split(":", 1)
    return key.strip().upper().replace(" ", "_"), value.strip()


def parse_amd_smi(text: str) -> list[Gpu]:
    """`amd-smi static --asic` text. GPUs without a graphics version get target ''."""
    gpus: list[Gpu] = []
    current: dict[str, str] | None = None
    index = -1

    def flush() -> None:
        if current is not None:
            target = _arch_or_empty(current.get("TARGET_GRAPHICS_VERSION", ""))
            gpus.append(Gpu(index, target, current.get("MARKET_NAME", "")))

    for line in text.splitlines():
        head = re.match(r"^(GPU|CPU|NIC|CORE|SWITCH)\s*:\s*([0-9]+)\s*$", line.strip())
        if head and not line[:1].isspace():
            flush()
            current = {} if head.group(1) == "GPU" else None
            index = _index(head.group(2), len(gpus))
            continue
        if current is None:
            continue
        kv = _field(line)
        if kv and kv[0] in ("TARGET_GRAPHICS_VERSION", "MARKET_NAME") and kv[0] not in current:
            current[kv[0]] = kv[1]
    flush()
    return gpus


# The highest GPU index read from amd-smi's listing; a larger one, or one that is not plain decimal
# digits (a superscript "²", an Arabic-Indic "١", a bool, thousands of digits), is the GPU's position.
MAX_GPU_INDEX = 4095


def _index(raw: object, position: int) -> int:
    """amd-smi's index of a GPU, read by the one reader of numbers; `position` where it is none."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        return position
    try:
        return numeric.whole("amd-smi's GPU index", raw, 0, MAX_GPU_INDEX)
    except numeric.SettingError:
        return position


def parse_amd_smi_json(text: str) -> list[Gpu]:
    try:
        data = files.json_value(text, "amd-smi's JSON")
    except files.DataError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", data.get("gpus", [data]))
    gpus: list[Gpu] = []
    if not isinstance(data, list):
        return gpus
    for position, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(asic := entry.get("asic", entry), dict):
            continue
        target = _arch_or_empty(str(asic.get("target_graphics_version", "") or ""))
        gpus.append(Gpu(_index(entry.get("gpu", position), position), target,
                        str(asic.get("market_name", "") or "")))
    return gpus


def _rocminfo_blocks(text: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if re.match(r"^\s*Agent \d+\s*$", line):
            current = []
            blocks.append(current)
        elif current is not None:
            current.append(line)
    if not blocks:  # abbreviated listings without Agent headers: one block
        blocks.append(text.splitlines())
    return blocks


def parse_rocminfo(text: str) -> list[Gpu]:
    gpus: list[Gpu] = []
    for block in _rocminfo_blocks(text):
        name = marketing = device_type = ""
        isas: list[str] = []
        for line in block:
            kv = _field(line)
            if not kv:
                continue
            key, value = kv
            if key == "NAME":
                if value.startswith(ISA_PREFIX):
                    isas.append(value[len(ISA_PREFIX):])
                elif not name:
                    name = value
            elif key == "MARKETING_NAME" and not marketing:
                marketing = value
            elif key == "DEVICE_TYPE" and not device_type:
                device_type = value.upper()
        if (device_type and device_type != "GPU") or not is_arch(name):
            continue
        # Prefer the ISA that names the agent's own arch (newer ROCm also lists
        # a generic ISA such as gfx9-4-generic first).
        target = next((isa for isa in isas if base_arch(isa) == base_arch(name)), name)
        gpus.append(Gpu(len(gpus), target, marketing))
    return gpus
