"""The one check of a JSON value's shape (rocm_vllm_runtime.schema) against the schemas the readers
declare: the `jsonschema` library where it is installed, the module's own check of the same keywords
where not (the pins job's plain python3). Both give the same verdict on any JSON value (a property
test), every declared schema is a valid Draft 2020-12 schema that uses only the keywords both know, and
a refusal is one line naming the field."""
from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.pins import discover
from rocm_vllm_runtime import accuracy, files, schema

DECLARED = {
    "accuracy.json": accuracy.RESULTS_SCHEMA,
    "lm-eval samples": accuracy.samples_schema(["tiny_mla_loglik"]),
    "/v1/models": accuracy.MODELS_SCHEMA,
    "PyPI JSON API": discover.PYPI_SCHEMA,
}
NAMES = st.sampled_from(["ok", "problems", "scores", "selected", "runs", "settings", "data", "id", "releases",
                         "packagetype", "url", "filename", "digests", "sha256", "yanked", "doc_id", "filter",
                         "metrics", "filtered_resps", "prompt_hash", "tiny_mla_loglik", "tiny_mla_gen",
                         "cpu-vllm", "0.40.0", "attention_backends", "implementation", "x"])
SCALARS = (st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, -1.5, 0.5, float(2**53)])
           | st.sampled_from(["", "a" * 64, "sdist", "x", "0" * 63 + "g"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=4),
                      max_leaves=25)


def _near(schema_doc: dict):
    """Values shaped like what the schema describes, with random holes and wrong leaves."""
    def build(s: dict, depth: int = 0):
        if depth > 6:
            return VALUES
        kind = s.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        options = [VALUES]
        if "object" in kinds:
            props = {name: build(sub, depth + 1) for name, sub in s.get("properties", {}).items()}
            extra = s.get("additionalProperties")
            fixed = st.fixed_dictionaries({}, optional=props) if props else st.just({})
            if isinstance(extra, dict):
                more = st.dictionaries(NAMES, build(extra, depth + 1), max_size=2)
                options.append(st.tuples(fixed, more).map(lambda t: {**t[1], **t[0]}))
            else:
                options.append(fixed)
        if "array" in kinds:
            options.append(st.lists(build(s["items"], depth + 1) if "items" in s else VALUES, max_size=3))
        if "string" in kinds:
            options.append(st.sampled_from(["", "a" * 64, "sdist", "0" * 63 + "g", "x" * 5000]))
        return st.one_of(*options)
    return build(schema_doc)


@pytest.mark.parametrize("name", DECLARED)
def test_each_declared_schema_is_draft_2020_12_with_known_keywords_only(name):
    jsonschema.Draft202012Validator.check_schema(DECLARED[name])
    assert schema.unsupported(DECLARED[name]) == set()


@pytest.mark.parametrize("name", DECLARED)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_both_checks_give_the_same_verdict(name, data):
    declared = DECLARED[name]
    value = data.draw(_near(declared) | VALUES)
    by_library = schema.first_problem(value, declared, use_library=True)
    by_module = schema.first_problem(value, declared, use_library=False)
    assert (by_library == "") == (by_module == ""), (value, by_library, by_module)
    assert "\n" not in by_library + by_module


@settings(max_examples=200, deadline=None)
@given(value=VALUES)
def test_a_refusal_is_one_line_naming_where(value):
    try:
        schema.check(value, accuracy.RESULTS_SCHEMA, "ACCURACY_REFERENCE=/r/accuracy.json")
    except files.DataError as exc:
        assert str(exc).startswith("ACCURACY_REFERENCE=/r/accuracy.json: ") and "\n" not in str(exc)
        assert exc.kind == "schema"


def test_a_name_from_the_data_is_shown_quoted_and_cut():
    doc = {"settings": {}, "runs": {"a\nb" * 100: {"ok": "yes"}}}
    for library in (True, False):
        problem = schema.first_problem(doc, accuracy.RESULTS_SCHEMA, use_library=library)
        assert problem.startswith("runs.'a\\nba") and problem.endswith(".ok: must be true or false, not a string")
        assert "\n" not in problem and len(problem) < 200


@pytest.mark.parametrize("use_library", [True, False])
@pytest.mark.parametrize(("value", "kind"), [(1787222487.0, "a decimal number"), (1.0, "a decimal number"),
                                             (-0.0, "a decimal number"), (float(2**53), "a decimal number"),
                                             (1.5, "a decimal number"), (True, "true or false"), ("1", "a string")])
def test_an_integer_is_one_as_json_writes_it(value, kind, use_library):
    """JSON Schema takes 1.0 for an integer; a reader that declares one means 1 (a build argument, a
    timestamp, an index would read "1.0"): both validators refuse it, naming what it is."""
    assert schema.first_problem(value, {"type": "integer"}, use_library=use_library) == \
        f"the whole: must be an integer, not {kind}"
    assert schema.first_problem(1787222487, {"type": "integer"}, use_library=use_library) == ""
    assert schema.first_problem(value, {"type": "number"}, use_library=use_library) == ("" if kind.endswith(
        "number") else f"the whole: must be a number, not {kind}")
