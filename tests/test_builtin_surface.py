"""vLLM's built-in ROCM_AITER_MLA, release by release, against the plugin's feature table: every
item of the built-in's surface in each track's released source (the AITER names it imports, its
support and predicate functions, every method of its impl, its metadata fields) is classified in
backend/tests/data/builtin_surface.json, as a row of the feature table in backend/README.md (own,
delegated or refused there) or as internal. A release that adds a feature adds an item: this
fails, naming it, until someone classifies it (and the plugin routes it), before the plugin's
supported range may grow to that release."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from vllm_sdist import sdist_source, track_names

ROOT = Path(__file__).resolve().parents[1]
CLASSIFIED = ROOT / "backend/tests/data/builtin_surface.json"
BUILTIN = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
# support and predicate names: get_supported_*, supports_*, is_*, use_*, can_*, has_*, *_supported, ...
# The impl class: the own impl is it with the own decode, so every method it has is an item.
IMPL = "AiterMLAImpl"
PREDICATE = re.compile(r"^(supports?_|get_supported_|is_|use_|can_|has_)|_(supported|unsupported|enabled|superseded)$")


def surface(source: str) -> set[str]:
    """The built-in's surface items in a rocm_aiter_mla.py source text."""
    tree = ast.parse(source)
    items = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "aiter":
            items.update(f"aiter {node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            items.update(f"aiter {alias.name}" for alias in node.names if alias.name.split(".")[0] == "aiter")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and PREDICATE.search(node.name.lstrip("_")):
            items.add(f"function {node.name}")
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                # every method of the impl (the own impl inherits all but its decode), predicates elsewhere
                if isinstance(member, ast.FunctionDef) and (
                        node.name == IMPL or PREDICATE.search(member.name.lstrip("_"))):
                    items.add(f"method {node.name}.{member.name}")
                elif (node.name.endswith("Metadata") and isinstance(member, ast.AnnAssign)
                      and isinstance(member.target, ast.Name)):
                    items.add(f"field {node.name}.{member.target.id}")
    return items


def classified() -> dict[str, dict]:
    return json.loads(CLASSIFIED.read_text())["items"]


def feature_rows() -> set[str]:
    text = (ROOT / "backend/README.md").read_text()
    body = text.split("<!-- feature-table:start -->", 1)[1].split("<!-- feature-table:end -->", 1)[0]
    return {line.strip("|").split("|")[0].strip() for line in body.strip().splitlines()[2:]}


def unclassified(source: str) -> list[str]:
    return sorted(surface(source) - set(classified()))


@pytest.mark.parametrize("track", track_names())
def test_every_item_of_the_tracks_built_in_is_classified(track):
    missing = unclassified((sdist_source(track) / BUILTIN).read_text())
    assert not missing, (f"vLLM {track}'s built-in ROCM_AITER_MLA has {len(missing)} item(s) the plugin's feature "
                         f"table does not classify: {', '.join(missing)}; add each to {CLASSIFIED.relative_to(ROOT)} "
                         "with its feature-table row (own / delegated / refused in backend/README.md) or as internal")


def test_each_classification_is_a_row_of_the_feature_table_or_says_why_not():
    rows = feature_rows()
    for item, how in classified().items():
        assert set(how) in ({"row"}, {"internal"}), item
        if "row" in how:
            assert how["row"] in rows, f"{item}: no feature-table row {how['row']!r}"
        else:
            assert len(how["internal"]) > 20, f"{item}: say why it is not a feature"


def test_a_release_adding_a_predicate_a_field_or_an_aiter_call_fails():
    source = (sdist_source(track_names()[0]) / BUILTIN).read_text()
    assert unclassified(source) == []
    added = source + (
        "\nfrom aiter.ops.new_kernel import fused_thing\n"
        "def _new_feature_supported() -> bool:\n    return True\n"
        "class AiterMLAHelper2:\n    @staticmethod\n    def use_new_path(n):\n        return n\n"
        "class AiterMLANewMetadata:\n    new_field: int = 0\n"
        "class AiterMLAImpl:\n    def _fused_prefill_step(self):\n        pass\n"
    )
    assert unclassified(added) == ["aiter aiter.ops.new_kernel.fused_thing", "field AiterMLANewMetadata.new_field",
                                   "function _new_feature_supported", "method AiterMLAHelper2.use_new_path",
                                   "method AiterMLAImpl._fused_prefill_step"]


def test_no_classification_is_left_without_a_release():
    """Items no track's built-in has any more are removed, so the file stays what upstream has."""
    found = set().union(*(surface((sdist_source(t) / BUILTIN).read_text()) for t in track_names()))
    assert sorted(set(classified()) - found) == []
