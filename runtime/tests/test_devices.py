"""GPU listings of amd-smi (text and JSON) and rocminfo parse into the right targets."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocm_vllm_runtime.devices import base_arch, detect_format, parse_listing

LISTINGS = Path(__file__).parent / "listings"


@pytest.mark.parametrize("name, fmt, targets", [
    ("rocminfo_gfx942.txt", "rocminfo", ["gfx942:sramecc+:xnack-"] * 2),
    ("rocminfo_gfx950.txt", "rocminfo", ["gfx950:sramecc+:xnack-"] * 8),
    ("rocminfo_gfx90a.txt", "rocminfo", ["gfx90a:sramecc+:xnack-"] * 2),
    ("rocminfo_mixed.txt", "rocminfo", ["gfx942:sramecc+:xnack-", "gfx90a:sramecc+:xnack-"]),
    ("rocminfo_gfx1100.txt", "rocminfo", ["gfx1100"]),
    ("rocminfo_cpu_only.txt", "rocminfo", []),
    ("amdsmi_gfx942.txt", "amd-smi", ["gfx942"] * 8),
    ("amdsmi_gfx950.txt", "amd-smi", ["gfx950"] * 2),
    ("amdsmi_gfx90a.txt", "amd-smi", ["gfx90a"]),
    ("amdsmi_mixed.txt", "amd-smi", ["gfx942", "gfx950"]),
    ("amdsmi_no_arch.txt", "amd-smi", [""]),
    ("amdsmi_gfx942.json", "amd-smi-json", ["gfx942"] * 2),
    ("amdsmi_gfx950_gpu_data.json", "amd-smi-json", ["gfx950"]),
])
def test_listing_targets(name: str, fmt: str, targets: list[str]) -> None:
    text = (LISTINGS / name).read_text()
    assert detect_format(text) == fmt
    assert [g.target for g in parse_listing(text)] == targets


def test_generic_isa_does_not_hide_the_specific_one() -> None:
    gpus = parse_listing((LISTINGS / "rocminfo_gfx942.txt").read_text())
    assert "gfx9-4-generic" in (LISTINGS / "rocminfo_gfx942.txt").read_text()
    assert {g.arch for g in gpus} == {"gfx942"}


def test_cpu_agents_are_not_gpus() -> None:
    gpus = parse_listing((LISTINGS / "rocminfo_mixed.txt").read_text())
    assert [g.name for g in gpus] == ["AMD Instinct MI300X", "AMD Instinct MI250X/MI250"]
    assert [g.index for g in gpus] == [0, 1]


def test_rocminfo_without_agent_headers() -> None:
    text = "HSA Agents\n  Name:                    gfx942\n  Device Type:             GPU\n"
    assert [g.target for g in parse_listing(text)] == ["gfx942"]


@pytest.mark.parametrize("text", ["", "amd-smi: command failed\n", "[not json"])
def test_unusable_text_lists_nothing(text: str) -> None:
    assert parse_listing(text) == []


@pytest.mark.parametrize("target, arch", [
    ("gfx942:sramecc+:xnack-", "gfx942"),
    ("amdgcn-amd-amdhsa--gfx950:sramecc+:xnack-", "gfx950"),
    ("GFX90A", "gfx90a"),
    ("gfx1100", "gfx1100"),
])
def test_base_arch(target: str, arch: str) -> None:
    assert base_arch(target) == arch


@pytest.mark.parametrize("gpu", ["²", "١", "٣", "9" * 5000, True, -1, 4096, None, [1], "1.0"])
def test_an_amd_smi_gpu_index_that_is_no_plain_number_is_its_position(gpu) -> None:
    """amd-smi's "gpu" is read by the one reader of numbers: a superscript (int() refuses it), an
    Arabic-Indic digit (int() reads it), thousands of digits or no number at all stand for the GPU's
    place in the listing, never a traceback."""
    text = json.dumps([{"gpu": 7, "asic": {"target_graphics_version": "gfx942"}},
                       {"gpu": gpu, "asic": {"target_graphics_version": "gfx950"}}], ensure_ascii=False)
    assert [(g.index, g.target) for g in parse_listing(text)] == [(7, "gfx942"), (1, "gfx950")]


@pytest.mark.parametrize("head, indexes", [("GPU: ١", []), ("GPU: " + "9" * 5000, [0])])
def test_an_amd_smi_text_head_that_is_no_plain_number_is_no_traceback(head, indexes) -> None:
    """A head of non-ASCII digits is no head (int() would read it); thousands of digits: the position."""
    text = (LISTINGS / "amdsmi_gfx90a.txt").read_text().replace("GPU: 0", head, 1)
    assert [g.index for g in parse_listing(text)] == indexes
