"""The one check of the shape of data read from outside (a reference folder's results and samples, PyPI's
JSON answers): against a JSON Schema (Draft 2020-12) its reader declares, at the boundary where it is read,
so that the code after it can take the shape as given. An architecture test (tests/test_one_json_reader.py)
keeps JSON reading in rocm_vllm_runtime.files; this module says whether what was read has the declared
shape.

The schemas are validated with the `jsonschema` library wherever it is installed (the vLLM image, the
test environment). The pins job runs on a plain python3 and the runtime has no install requirements, so
where `jsonschema` is missing the same schemas are checked by `_problems` here, which knows the few
keywords in SUPPORTED only and refuses a schema with any other (a property test holds its verdicts to the
library's). A refusal is one line, files.DataError: `where: field: what is wrong` (kind "schema").

"integer" is an integer as JSON writes one: 1787222487.0 is a number, not an integer (JSON Schema takes
a number with a zero fraction for one; a build argument, a timestamp or an index then reads "1.0"), in
both validators.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from .files import DataError

# The keywords a declared schema may use: what both validators know.
SUPPORTED = frozenset({"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                       "maxProperties", "maxLength", "pattern", "enum", "minimum", "maximum"})
_TYPES = {"object": "an object", "array": "a list", "string": "a string", "integer": "an integer",
          "number": "a number", "boolean": "true or false", "null": "null"}


# What a value is called in a message (bool before int: True is an int too).
_KINDS = ((bool, "true or false"), (float, "a decimal number"), (int, "a number"), (str, "a string"),
          (list, "a list"), (dict, "an object"))
_PYTHON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _KINDS if isinstance(value, kind)), type(value).__name__)


def _is(value: object, name: str) -> bool:
    if name in _PYTHON_TYPES:
        return isinstance(value, _PYTHON_TYPES[name])
    if name == "null":
        return value is None
    if name == "integer":  # written as one: 1.0 is not (strict_integer)
        return strict_integer(None, value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # "number"


def strict_integer(_checker: object, value: object) -> bool:
    """An integer as JSON writes one (1, never 1.0 or true): both validators' "integer"."""
    return isinstance(value, int) and not isinstance(value, bool)


def _field(path: tuple) -> str:
    """The field as `a.b[0].c`; a name taken from the data is shown quoted when it is not plain, and cut."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = part if re.fullmatch(r"[\w.,:+-]{1,80}", part) else repr(part[:60])
        out += f".{name}" if out else name
    return out or "the whole"


# What is wrong when a keyword fails (rule: the keyword's value in the schema; value: the data's).
_WHAT = {"additionalProperties": "holds a name that does not belong there",
         "minItems": "holds fewer than {rule} entries", "minProperties": "holds fewer than {rule} entries",
         "maxItems": "holds more than {rule} entries", "maxProperties": "holds more than {rule} entries",
         "maxLength": "is longer than {rule} characters", "pattern": "does not match {rule}",
         "minimum": "must be at least {rule}", "maximum": "must be at most {rule}", "const": "must be {rule!r}",
         "not": "must not be {value!r}", "uniqueItems": "holds an entry twice"}


def _message(keyword: str, rule: object, value: object) -> tuple[str, str]:
    """(a name to add to the field, what is wrong) for a failed keyword."""
    if keyword == "type":
        names = rule if isinstance(rule, list) else [rule]
        return "", f"must be {' or '.join(_TYPES[n] for n in names)}, not {_kind(value)}"
    if keyword == "required":
        missing = next(n for n in rule if n not in value)  # type: ignore[union-attr,operator]
        return missing, "is missing"
    if keyword == "enum":
        return "", f"must be one of {', '.join(map(repr, rule))}"  # type: ignore[arg-type]
    return "", _WHAT.get(keyword, "breaks {keyword} {rule!r}").format(keyword=keyword, rule=rule, value=value)


def _problems(value: object, schema: Mapping, path: tuple = ()) -> Iterator[tuple[tuple, str, object, object]]:
    """(path, keyword, rule, value) of each failed keyword, by the standard library: the first of each
    value's failures (a wrong type stops the value's other checks, as a reader would)."""
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, n) for n in names):
            yield path, "type", schema["type"], value
            return
    if "enum" in schema and not any(_is(value, _json_type(e)) and value == e for e in schema["enum"]):
        yield path, "enum", schema["enum"], value
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield path, "maxLength", schema["maxLength"], value
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield path, "pattern", schema["pattern"], value
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:  # type: ignore[operator]
            yield path, "minimum", schema["minimum"], value
        if "maximum" in schema and value > schema["maximum"]:  # type: ignore[operator]
            yield path, "maximum", schema["maximum"], value
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            yield path, "minItems", schema["minItems"], value
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield path, "maxItems", schema["maxItems"], value
        if "items" in schema:
            for i, item in enumerate(value):
                yield from _problems(item, schema["items"], (*path, i))
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            yield path, "maxProperties", schema["maxProperties"], value
        if any(n not in value for n in schema.get("required", ())):
            yield path, "required", schema["required"], value
        known, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in known:
                yield from _problems(item, known[name], (*path, name))
            elif extra is False:
                yield (*path, name), "additionalProperties", False, item
            elif isinstance(extra, Mapping):
                yield from _problems(item, extra, (*path, name))


def _json_type(value: object) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is(value, name):
            return "number" if name == "integer" else name
    return ""


def unsupported(schema: object) -> set[str]:
    """The keywords of `schema` (and the schemas inside it) that are not in SUPPORTED."""
    if not isinstance(schema, Mapping):
        return set()
    inner = [*schema.get("properties", {}).values(), schema.get("items"), schema.get("additionalProperties")]
    return (set(schema) - SUPPORTED).union(*map(unsupported, inner))


def _library():
    try:
        import jsonschema  # noqa: PLC0415 -- where installed (the image, the tests); else _problems
    except ImportError:
        return None
    return jsonschema


def _validator(library, schema: Mapping):  # noqa: ANN001, ANN202
    """The library's Draft 2020-12 validator of `schema`, its "integer" strict_integer."""
    base = library.Draft202012Validator
    strict = library.validators.extend(base, type_checker=base.TYPE_CHECKER.redefine("integer", strict_integer))
    return strict(schema)


def first_problem(value: object, schema: Mapping, use_library: bool | None = None) -> str:
    """'' when `value` has the shape `schema` declares, else `field: what is wrong`."""
    library = _library() if use_library is not False else None
    if use_library and library is None:
        raise ImportError("jsonschema is not installed")
    if library is not None:
        error = library.exceptions.best_match(_validator(library, schema).iter_errors(value))
        return "" if error is None else _library_line(error)
    found = next(_problems(value, schema), None)
    if found is None:
        return ""
    path, keyword, rule, at = found
    name, what = _message(str(keyword), rule, at)
    return f"{_field((*path, name) if name else path)}: {what}"


def _library_line(error) -> str:
    """`field: what is wrong` of one of the library's errors."""
    path, keyword, rule, at = tuple(error.absolute_path), str(error.validator), error.validator_value, error.instance
    if keyword == "additionalProperties":  # the library names the object; name the extra entry
        extra = sorted(set(at) - set(error.schema.get("properties", {})))
        path, at = (*path, extra[0]), at[extra[0]]
    elif "propertyNames" in error.schema_path:  # the name itself is wrong: name it
        path = (*path, at)
    if keyword == "pattern" and isinstance(error.schema.get("description"), str):
        return f"{_field(path)}: must be {error.schema['description']}"  # what the pattern stands for
    name, what = _message(keyword, rule, at)
    return f"{_field((*path, name) if name else path)}: {what}"


def problems(value: object, schema: Mapping) -> list[str]:
    """Every `field: what is wrong` of `value` against `schema` (any Draft 2020-12 keyword), in the
    order of the fields; the `jsonschema` library only (ImportError where it is missing)."""
    import jsonschema  # noqa: PLC0415

    errors = _validator(jsonschema, schema).iter_errors(value)
    found = [_library_line(jsonschema.exceptions.best_match([e])) for e in errors]
    return sorted(dict.fromkeys(found))


def check(value: object, schema: Mapping, where: str) -> object:
    """`value` when it has the shape `schema` declares; else DataError in one line naming `where` and the
    field (kind "schema")."""
    problem = first_problem(value, schema)
    if problem:
        raise DataError(where, "schema", problem)
    return value
