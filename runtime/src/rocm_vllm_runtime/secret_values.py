"""Secrets: what makes a value unusable as an API key, said without showing it; and the one
masking of secrets in everything printed or written (command lines, logs, reports).

Secret-bearing: the options --api-key, --hf-token, --token and any --*-token, --*-key,
--*-secret, --*-password (underscores count as dashes), and the variables *_TOKEN, *_KEY,
*_SECRET, *_PASSWORD (HF_TOKEN, VLLM_API_KEY, ...), in NAME=VALUE arguments too; and the
credentials of a URL (scheme://USER:PASSWORD@host, scheme://TOKEN@host: the whole userinfo),
wherever a URL stands in an argument or a text.

A URL's userinfo is read as its authority's parts, not searched for: the authority runs from
`scheme://` to the first `/`, `?` or line break (or the next `scheme://`), and its userinfo is
everything up to the authority's last `@`. A password pasted without percent-encoding may hold
`@`, `#`, `:` or a space; all of it is masked, never a part. Where a `:` stands before that
authority's end and an `@` follows it on the line, the password may hold `/` or `?` too: the userinfo
then runs to the line's last `@` (unless the authority is a host with a port, 127.0.0.1:8000,
host.example:443, localhost:8000, and holds no `@`): more may be masked, never less. And
`user:password@host` without a scheme (a proxy setting, user:pw@proxy:3128) is masked where it
stands as a word of its own (an image's `name:tag@sha256:...` is no userinfo)."""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

MASK = "***"
_SECRET_OPTION = re.compile(r"\A--?(?:[a-z0-9]+-)*(?:api-key|token|key|secret|password|passwd)\Z")
_SECRET_NAME = re.compile(r"(?:\A|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD)\Z")
# Options that take one or more values (vLLM's --api-key); the others take one.
_MANY_VALUES = ("--api-key",)

# Where a URL starts (its scheme and "://"), and what ends its authority.
_URL_START = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://")
_AUTHORITY_END = re.compile(r"[/?\r\n]")
_LINE_END = re.compile(r"[\r\n]")
# An authority that is a host and its port (a dotted name or address, localhost, [IPv6]), no userinfo.
_HOST_PORT = re.compile(r"(?i)(?:\[[^\]]*\]|localhost|[^:@\s]*\.[^:@\s]*):[0-9]{1,5}")
# user:password@ without a scheme: a word's start, a user, ":" (not "://"), and the word's last "@"
# that a host follows and no image digest (name:tag@sha256:<hex>).
_BARE_USERINFO = re.compile(r"(?i)(?<![^\s\"'`(<=,;\[])[^\s\"'`/?#@:=;,()<>\[\]]+:(?!//)\S*@"
                            r"(?![a-z0-9]+:[0-9a-f]{32})(?=[\w\[])")

# An HTTP header value the key travels in (Authorization: Bearer KEY) holds visible ASCII only.
_VISIBLE = {chr(c) for c in range(0x21, 0x7F)}


def secret_value_problem(value: str, what: str = "the API key") -> str:
    """'' when value can be sent in an HTTP header as it is (a bearer API key, a Hugging Face
    token); else why not, in one line that does not show the value."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return (f"{what} is wrapped in quotes, which are part of its value (an env file for a Kubernetes Secret, "
                "`kubectl create secret --from-env-file` and `docker run --env-file` keep them), so it would "
                "never match what clients and servers send: remove the quotes (the value is not shown)")
    c = next((c for c in value if c not in _VISIBLE), None)
    if c is None:
        return ""
    trailing = value[len(value.rstrip()):]
    where = "at its end" if c in trailing else f"at position {value.index(c) + 1}"
    name = {"\n": "a newline", "\r": "a carriage return", " ": "a space", "\t": "a tab"}.get(c, f"U+{ord(c):04X}")
    hint = (" (a Kubernetes Secret or env file made from a file with a trailing newline has one)"
            if c in "\r\n" else "")
    return (f"{what} holds {name} {where}{hint}, which an HTTP header cannot carry, so every request with it "
            "would be refused: remove it (the value is not shown)")


def api_key_problem(key: str) -> str:
    """'' when key can be sent as a bearer token; else why not (one line, the key not shown)."""
    return secret_value_problem(key, "the API key")


def is_secret_option(option: str) -> bool:
    return bool(_SECRET_OPTION.match(option.lower().replace("_", "-")))


def is_secret_name(name: str) -> bool:
    """A variable whose value is a secret (HF_TOKEN, VLLM_API_KEY, AWS_SECRET, ...)."""
    return bool(_SECRET_NAME.search(name.upper()))


def userinfo_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) in text of the userinfo of every URL in it (empty where a URL has none)."""
    spans = []
    starts = [m.end() for m in _URL_START.finditer(text)]
    for i, begin in enumerate(starts):
        limit = starts[i + 1] if i + 1 < len(starts) else len(text)
        line = _LINE_END.search(text, begin, limit)
        line_end = line.start() if line else limit
        end = _AUTHORITY_END.search(text, begin, line_end)
        authority_end = end.start() if end else line_end
        at = text.rfind("@", begin, authority_end)
        colon = text.find(":", begin, authority_end)
        if colon >= 0 and text.find("@", colon, line_end) >= 0 and \
                (at >= begin or not _HOST_PORT.fullmatch(text, begin, authority_end)):
            at = text.rfind("@", begin, line_end)  # user:pa/ss@host: the password holds "/" or "?"
        if at >= begin:
            spans.append((begin, at))
    for match in _BARE_USERINFO.finditer(text):
        start, at = match.start(), match.end() - 1
        if not any(b - 3 <= at and start <= e for b, e in spans):  # not within a URL's own
            spans.append((start, at))
    return sorted(spans)


def masked_url(text: str) -> str:
    """``text`` with the userinfo of every URL in it masked whole: scheme://***@host."""
    out, last = [], 0
    for begin, end in userinfo_spans(text):
        out += [text[last:begin], MASK]
        last = end
    return "".join(out) + text[last:]


def masked(args: Sequence[str]) -> list[str]:
    """``args`` with the value of every secret-bearing option (--opt VALUE, --opt=VALUE; vLLM's
    --api-key takes several) and of every secret NAME=VALUE replaced by ***, and the credentials of
    every URL masked (``masked_url``)."""
    out: list[str] = []
    taking = 0  # values still to mask: 1, or -1 for "every value up to the next option"
    for arg in args:
        option, eq, _ = arg.partition("=")
        if arg.startswith("-") and eq and is_secret_option(option):
            out.append(f"{option}={MASK}")
            taking = 0
        elif arg.startswith("-") and is_secret_option(arg):
            out.append(arg)
            taking = -1 if arg.lower().replace("_", "-") in _MANY_VALUES else 1
        elif taking and not arg.startswith("-"):
            out.append(MASK)
            taking = taking - 1 if taking > 0 else -1
        elif not arg.startswith("-") and eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", option) \
                and is_secret_name(option):
            out.append(f"{option}={MASK}")
            taking = 0
        else:
            out.append(masked_url(arg))
            taking = 0
    return out


def shown(command: Sequence[str]) -> str:
    """A command line as it may be printed: shell-quoted, its secrets masked."""
    return shlex.join(masked(command))


def secret_values(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The secrets a run holds: the values ``masked`` hides in ``args`` (of a URL, its password),
    and those of the secret variables of ``env``."""
    values = [a.split("=", 1)[1] if m.endswith("=" + MASK) else a for a, m in zip(args, masked(args))
              if a != m and m != masked_url(a)]
    for a in args:
        for begin, end in userinfo_spans(a):
            user, colon, password = a[begin:end].partition(":")
            values += [a[begin:end], password if colon else user]
    values += [v for k, v in env.items() if is_secret_name(k)]
    return [v for v in values if len(v) >= 4]


def mask_text(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every occurrence of each secret replaced by *** (longest first), and the
    credentials of every URL in it masked."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return masked_url(text)
