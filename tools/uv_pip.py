"""uv pip, given the package sources and network settings pip would use.

uv reads no pip setting: neither PIP_* variables nor pip's configuration files. The test
environment (ci/test.sh) and the track environments (tests/track_env.py) are installed with uv, on
machines configured for pip: this module is the one place that turns pip's settings into uv's.

pip's settings are read by pip itself (`python -m pip config list`, this Python's pip): its
configuration files (global, user, site, PIP_CONFIG_FILE) and its PIP_* variables, each overriding
the one before as pip applies them to `pip install` (section global, then install, then the
environment).

* index-url, extra-index-url, find-links, no-index, trusted-host: uv's --index-url,
  --extra-index-url, --find-links, --no-index and --allow-insecure-host. Where there is more than
  one source, --index-strategy unsafe-best-match: pip takes the best version from all of them, uv by
  default only from the first index that has the name.
* Without find-links, torch's CPU build comes from PyTorch's CPU index (TORCH_CPU_INDEX), when the
  caller asks for torch's sources.
* cert, timeout (a whole number of seconds for uv, rounded up) and proxy: SSL_CERT_FILE,
  UV_HTTP_TIMEOUT and HTTPS_PROXY/HTTP_PROXY, each where uv's own is unset.

Standard library only, and the runtime's children, numeric and secret_values modules: ci/test.sh installs
the runtime (editable) before it runs this module; the tools' project (tools/pyproject.toml) declares it.

    python3 -m tools.uv_pip [--torch] UV pip install ARGS...

runs `UV pip install ARGS...` with those sources added and that environment (--torch: with torch's
CPU sources too).
"""
from __future__ import annotations

import ast
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence

from rocm_vllm_runtime import children, numeric, secret_values

# Where torch's CPU build comes from when no wheelhouse is configured (find-links).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pip's sections for `pip install`, each overriding the ones before it.
SECTIONS = ("global", "install", ":env:")
# pip's options this module carries over, by pip's long name; another spelling pip takes for each.
OPTIONS = {"index-url": "index-url", "extra-index-url": "extra-index-url", "find-links": "find-links",
           "no-index": "no-index", "trusted-host": "trusted-host", "cert": "cert", "timeout": "timeout",
           "default-timeout": "timeout", "proxy": "proxy"}
# pip's reading of a flag given as text (pip._internal.utils.misc.strtobool, after lower()); anything
# else pip refuses, and so does this module. An empty value pip leaves unset.
TRUE = ("1", "true", "yes", "on", "y", "t")
FALSE = ("0", "false", "no", "off", "n", "f")
PIP_TIMEOUT_S = 60.0  # pip config list reads files only


class PipSettings(dict):
    """pip's effective value per option (OPTIONS' names), and where each was set (`where`)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: dict[str, str] = {}


def _shown_key(section: str, key: str) -> str:
    return f"PIP_{key.upper().replace('-', '_')}" if section == ":env:" else f"pip config {section}.{key}"


def parse_config_list(lines: Iterable[str]) -> PipSettings:
    """pip's settings for `pip install` from the lines `pip config list` prints (section.key='value')."""
    found: dict[tuple[str, str], str] = {}
    for line in lines:
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not (sep and dot) or section not in SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        found[(section, key.strip().lower().replace("_", "-"))] = str(value)
    out = PipSettings()
    for (section, key), value in sorted(found.items(), key=lambda item: SECTIONS.index(item[0][0])):
        if key in OPTIONS:  # a later section overrides
            out[OPTIONS[key]] = value
            out.where[OPTIONS[key]] = _shown_key(section, key)
    return out


def pip_settings(python: str = sys.executable) -> PipSettings:
    """pip's settings as that Python's pip reads them in this process's environment."""
    out = children.output([python, "-m", "pip", "config", "list"], PIP_TIMEOUT_S)
    if out.error or out.timed_out or out.returncode != 0:
        why = out.error or (f"no answer within {PIP_TIMEOUT_S:g} s" if out.timed_out else _failure(out))
        raise SystemExit(f"error: cannot read pip's settings with {python} -m pip config list: {why}")
    return parse_config_list(out.stdout.splitlines())


def flag(settings: Mapping[str, str], key: str) -> bool:
    """A boolean option of pip's settings as pip reads it: on, off (also where unset or empty), or
    refused in one line naming the setting, as pip refuses it."""
    value = settings.get(key, "")
    if value == "" or value.lower() in FALSE:
        return False
    if value.lower() in TRUE:
        return True
    where = getattr(settings, "where", {}).get(key, f"pip's {key}")
    raise SystemExit(f"error: {where}={value[:40]!r} is not a boolean pip takes: give one of "
                     f"{'/'.join(TRUE)} or {'/'.join(FALSE)} (pip itself refuses it)")


# Where pip names a configuration file it cannot parse (configparser's words, as pip prints them).
_CONFIG_FILE = re.compile(r"^(?:file: |Source contains parsing errors: |File contains no section headers\.\s*file: )"
                          r"'([^'\n]+)'(?:, line: (\d+))?", re.M)


def _failure(out) -> str:
    """Why `pip config list` failed, in one line that never shows a line of a configuration file
    (pip echoes the line it cannot parse, an index's credentials and all): the file and line it
    names, or pip's last line with every URL's credentials masked where it names none."""
    text = f"{out.stdout}\n{out.stderr}"
    if "Configuration file could not be loaded" in text or _CONFIG_FILE.search(text):
        found = _CONFIG_FILE.search(text)
        place = f"{found.group(1)}{', line ' + found.group(2) if found.group(2) else ''}" if found else \
            "one of its configuration files"
        return (f"pip cannot parse {place} (its lines are not shown: they may hold credentials): fix it, or "
                "set PIP_CONFIG_FILE=/dev/null to use none")
    said = (out.stderr.strip() or out.stdout.strip() or f"exit code {out.returncode}").splitlines()[-1]
    return secret_values.masked_url(said)


def pip_sources(settings: Mapping[str, str]) -> list[str]:
    """uv's options for the package sources pip's settings name."""
    out: list[str] = []
    if flag(settings, "no-index"):
        out.append("--no-index")  # no index at all, extra ones included
    else:
        out += ["--index-url", settings["index-url"]] if settings.get("index-url") else []
        for url in settings.get("extra-index-url", "").split():
            out += ["--extra-index-url", url]
    for place in settings.get("find-links", "").split():
        out += ["--find-links", place]
    for host in settings.get("trusted-host", "").split():
        out += ["--allow-insecure-host", host]
    return _as_pip_chooses(out)


def _as_pip_chooses(sources: list[str]) -> list[str]:
    """sources, and the index strategy that makes uv choose among them as pip does (the best
    version of every index and link), where there is more than one place to look."""
    places = sum(1 for s in sources if s in ("--extra-index-url", "--find-links"))
    places += 0 if "--no-index" in sources else 1  # the index (PyPI unless index-url)
    return [*sources, "--index-strategy", "unsafe-best-match"] if places > 1 else sources


def torch_sources(settings: Mapping[str, str]) -> list[str]:
    """pip_sources, and PyTorch's CPU index where no wheelhouse (find-links) is configured."""
    if settings.get("find-links", "").split():
        return pip_sources(settings)
    return pip_sources({**settings, "extra-index-url": f"{settings.get('extra-index-url', '')} {TORCH_CPU_INDEX}"})


def uv_environment(environ: Mapping[str, str], settings: PipSettings) -> dict[str, str]:
    """The environment for uv: pip's certificate bundle, network timeout and proxy where uv's own
    are unset. A timeout uv cannot take stops in one line naming pip's setting."""
    env = dict(environ)
    if settings.get("cert") and not env.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("timeout") and not env.get("UV_HTTP_TIMEOUT"):
        name = settings.where.get("timeout", "pip's timeout")
        try:
            seconds = numeric.duration(name, settings["timeout"])
        except numeric.SettingError as exc:
            raise SystemExit(f"error: {exc}") from None
        env["UV_HTTP_TIMEOUT"] = str(math.ceil(seconds))  # uv takes whole seconds; pip 15.5 as well
    if settings.get("proxy") and not any(env.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                                                               "http_proxy", "ALL_PROXY", "all_proxy")):
        env["HTTPS_PROXY"] = env["HTTP_PROXY"] = settings["proxy"]
    return env


def command(argv: Sequence[str], settings: Mapping[str, str]) -> list[str]:
    """The uv command line for `[--torch] UV ARGS...`: ARGS, then the sources."""
    args = list(argv)
    with_torch = bool(args) and args[0] == "--torch"
    if with_torch:
        args = args[1:]
    if len(args) < 3 or args[1:3] != ["pip", "install"]:
        raise SystemExit("usage: python3 -m tools.uv_pip [--torch] UV pip install ARGS...")
    sources = torch_sources(settings) if with_torch else pip_sources(settings)
    if "--index-strategy" in sources and any(a == "--index-strategy" or a.startswith("--index-strategy=")
                                             for a in args):
        sources = sources[:-2]  # the caller's own choice (_as_pip_chooses adds the strategy last)
    return [*args, *sources]


def main(argv: Sequence[str]) -> None:
    command(argv, {})  # usage first
    settings = pip_settings()
    cmd = command(argv, settings)
    env = uv_environment(os.environ, settings)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        raise SystemExit(f"error: cannot run {cmd[0]}: {exc.strerror}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
