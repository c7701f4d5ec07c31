"""A component's pins, handed to a build step as one build arg holding a JSON object (AITER_PINS,
PYTORCH_PINS, VLLM_PINS: python3 -m ci.pins args and docker-bake.hcl write them), as shell
variables. Standard library only (it runs in the source stages, before anything is installed).

    python3 pins.py NAME     print PREFIX_KEY='value' lines for `eval` (lib.sh load_pins NAME)

PREFIX is NAME without _PINS; KEY is the path of a value in the object, upper case, joined by _
(VLLM_PINS {"triton_kernels": {"commit": ...}} gives VLLM_TRITON_KERNELS_COMMIT). null, an
unresolved pin, becomes UNRESOLVED; a list becomes its items joined by spaces.
Errors (the arg unset, not a JSON object): one line naming the build arg; exit status 1.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys

UNRESOLVED = "UNRESOLVED"
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


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
    except ValueError as exc:
        raise PinsError(f"the build arg {name} is not JSON ({exc}): pass it as python3 -m ci.pins args prints it") \
            from None
    if not isinstance(value, dict):
        raise PinsError(f"the build arg {name} is not a JSON object: pass it as python3 -m ci.pins args prints it")
    return value


def flatten(value: dict, prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise PinsError(f"{prefix}: key {key!r} is not a lower-case name")
        name = f"{prefix}_{key.upper()}"
        if isinstance(item, dict):
            out.update(flatten(item, name))
        elif item is None:
            out[name] = UNRESOLVED
        elif isinstance(item, list):
            if not all(isinstance(v, str) and v and " " not in v for v in item):
                raise PinsError(f"{name}: a list of names without spaces is expected")
            out[name] = " ".join(item)
        elif isinstance(item, (str, int)) and not isinstance(item, bool):
            out[name] = str(item)
        else:
            raise PinsError(f"{name}: a string, number, list or null is expected, not {type(item).__name__}")
    return out


def shell(name: str, env=os.environ) -> str:
    prefix = name[:-len("_PINS")] if name.endswith("_PINS") else name
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
