"""API keys: what makes a value unusable as one, said without showing it."""
from __future__ import annotations

# An HTTP header value the key travels in (Authorization: Bearer KEY) holds visible ASCII only.
_VISIBLE = {chr(c) for c in range(0x21, 0x7F)}


def api_key_problem(key: str) -> str:
    """'' when key can be sent as a bearer token; else why not (one line, the key not shown)."""
    bad = [c for c in key if c not in _VISIBLE]
    if not bad:
        return ""
    c = bad[0]
    trailing = key[len(key.rstrip()):]
    where = "at its end" if c in trailing else f"at position {key.index(c) + 1}"
    name = {"\n": "a newline", "\r": "a carriage return", " ": "a space", "\t": "a tab"}.get(c, f"U+{ord(c):04X}")
    hint = (" (a Kubernetes Secret or env file made from a file with a trailing newline has one)"
            if c in "\r\n" else "")
    return (f"the API key holds {name} {where}{hint}, which an HTTP header cannot carry, so every client would be "
            "refused: remove it (the key is not shown)")
