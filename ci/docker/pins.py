"""A component's pins, handed to a build step as one build arg holding a JSON object (AITER_PINS,
PYTORCH_PINS, THEROCK_PINS, VLLM_PINS: python3 -m ci.pins args and docker-bake.hcl write them), as shell
variables. Standard library only (it runs in the source stages, before anything is installed).

    python3 pins.py NAME     print PREFIX_KEY='value' lines for `eval` (lib.sh load_pins NAME)

PREFIX is NAME without _PINS; KEY is the path of a value in the object, upper case, joined by _
(VLLM_PINS {"triton_kernels": {"commit": ...}} gives VLLM_TRITON_KERNELS_COMMIT). null, an
unresolved pin, becomes UNRESOLVED; a list becomes its items joined by spaces.
Each arg has a schema (SCHEMA: its keys, each a kind of value with the pattern of versions.json's
strings, ci/pins/model.py; tests hold the two equal): an unknown key, a value of the wrong kind, a
line break, a quote or a leading '-' stop the step. Errors (the arg unset, not a JSON object, not
its schema): one line naming the build arg and the key; exit status 1.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys

UNRESOLVED = "UNRESOLVED"
_KEY = re.compile(r"\A[a-z][a-z0-9_]*\Z")

# The patterns of versions.json's strings (ci/pins/model.py: COMMIT_RE, SHA256_RE, NAME_RE,
# REPOSITORY_RE, HTTPS_URL_RE; tests/test_build_scripts.py holds them equal).
PATTERNS = {
    "commit": re.compile(r"\A[0-9a-f]{40}\Z"),
    "sha256": re.compile(r"\A[0-9a-f]{64}\Z"),
    "name": re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+/:@=~-]*\Z"),
    "repository": re.compile(r"\A(?:(?:https?|git|ssh|file)://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+"
                             r"|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9._~/+-]+"
                             r"|/[A-Za-z0-9._~/+-]*)\Z"),
    "url": re.compile(r"\Ahttps://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+\Z"),
}
# Each arg's keys (python3 -m ci.pins args / bake write them from versions.json: ci.pins.model
# components()) and the kind of each value: a pattern above, "names" (a list of names), or
# "<pattern>|none" (that, or the word none). Every value may be null (an unresolved pin).
SCHEMA = {
    "AITER_PINS": {"ck_commit": "commit", "ck_submodule_path": "name", "commit": "commit",
                   "hipkittens_commit": "commit|none", "hipkittens_repository": "repository",
                   "repository": "repository", "required_modules": "names", "requirements_lock": "name",
                   "requirements_lock_sha256": "sha256|none", "tag": "name"},
    "PYTORCH_PINS": {"index_url": "url", "lock": "name", "lock_sha256": "sha256",
                     "torch": {"torch": "name", "torchaudio": "name", "torchvision": "name"}},
    "THEROCK_PINS": {"index_url": "url", "lock": "name", "lock_sha256": "sha256",
                     "triton": {"commit": "commit", "repository": "repository", "version": "name"}},
    "VLLM_PINS": {"commit": "commit", "repository": "repository", "tag": "name",
                  "triton_kernels": {"commit": "commit", "path": "name", "repository": "repository"}},
}


class PinsError(ValueError):
    pass


def load(name: str, env=os.environ) -> dict:
    """The JSON object held by the build arg `name`."""
    text = env.get(name, "")
    if not text:
        raise PinsError(f"the build arg {name} is not set: pass it (python3 -m ci.pins args prints it; "
                        "docker buildx bake sets it)")
    try:
        value = json.loads(text)
    except RecursionError:
        raise PinsError(f"the build arg {name} is nested too deeply: pass it as python3 -m ci.pins args prints it") \
            from None
    except ValueError as exc:
        raise PinsError(f"the build arg {name} is not JSON ({exc}): pass it as python3 -m ci.pins args prints it") \
            from None
    if not isinstance(value, dict):
        raise PinsError(f"the build arg {name} is not a JSON object: pass it as python3 -m ci.pins args prints it")
    return value


def _value(item, kind: str, name: str) -> str:
    """A value of ``kind`` as its shell variable holds it."""
    if item is None:
        return UNRESOLVED
    if kind == "names":
        if not isinstance(item, list) or not all(isinstance(v, str) and PATTERNS["name"].match(v) for v in item):
            raise PinsError(f"{name}: a list of names is expected (letters, digits and . _ + / : @ = ~ -)")
        return " ".join(item)
    if not isinstance(item, str):
        raise PinsError(f"{name}: a string or null is expected, not {type(item).__name__}")
    if kind.endswith("|none"):
        if item != "none" and not PATTERNS[kind[:-len("|none")]].match(item):
            raise PinsError(f"{name}: a {kind[:-len('|none')]} or \"none\" is expected, not {item!r}")
    elif not PATTERNS[kind].match(item):
        raise PinsError(f"{name}: not a {kind} ({item!r}): no spaces, quotes or line breaks, no leading '-'")
    return item


def flatten(value: dict, prefix: str, schema: dict | None = None) -> dict[str, str]:
    """The shell variables of ``value`` under ``schema`` (SCHEMA[prefix + "_PINS"] by default)."""
    schema = SCHEMA.get(f"{prefix}_PINS", {}) if schema is None else schema
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise PinsError(f"{prefix}: key {key!r} is not a lower-case name")
        name = f"{prefix}_{key.upper()}"
        if key not in schema:
            raise PinsError(f"{name}: unknown key {key!r} (known: {', '.join(sorted(schema))}): pass the arg as "
                            "python3 -m ci.pins args prints it")
        kind = schema[key]
        if isinstance(kind, dict):
            if not isinstance(item, dict):
                raise PinsError(f"{name}: an object is expected, not {type(item).__name__}")
            out.update(flatten(item, name, kind))
        elif isinstance(item, dict):
            raise PinsError(f"{name}: a {kind} is expected, not an object")
        else:
            out[name] = _value(item, kind, name)
    return out


def shell(name: str, env=os.environ) -> str:
    if name not in SCHEMA:
        raise PinsError(f"{name}: not a build arg of pins (known: {', '.join(sorted(SCHEMA))})")
    prefix = name[:-len("_PINS")]
    return "".join(f"{var}={shlex.quote(value)}\n" for var, value in flatten(load(name, env), prefix).items())


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith("_PINS"):
        print("usage: pins.py NAME_PINS", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(shell(argv[0]))
    except PinsError as exc:
        print(f"pins: ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
