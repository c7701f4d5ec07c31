"""uv pip, given the package sources and network settings pip would use.

uv reads no PIP_* variable. The test environment (ci/test.sh) and the track environments
(tests/track_env.py) are installed with uv, on machines configured for pip: this module is the one
place that turns pip's settings into uv's.

* PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS: uv's --index-url, --extra-index-url and
  --find-links (a wheelhouse of torch's CPU build, say).
* Without PIP_FIND_LINKS, torch's CPU build comes from PyTorch's CPU index (TORCH_CPU_INDEX), when
  the caller asks for torch's sources.
* PIP_CERT (when SSL_CERT_FILE is unset) and PIP_DEFAULT_TIMEOUT (when UV_HTTP_TIMEOUT is unset).

Standard library only: ci/test.sh runs it before the test environment exists.

    python3 ci/uv_pip.py [--torch] UV pip install ARGS...

runs `UV pip install ARGS...` with those sources added and that environment (--torch: with torch's
CPU sources too).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

# Where torch's CPU build comes from when no wheelhouse is configured (PIP_FIND_LINKS).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pip_sources(environ: Mapping[str, str]) -> list[str]:
    """uv's options for the package sources pip's settings name."""
    out: list[str] = []
    if environ.get("PIP_INDEX_URL"):
        out += ["--index-url", environ["PIP_INDEX_URL"]]
    for url in environ.get("PIP_EXTRA_INDEX_URL", "").split():
        out += ["--extra-index-url", url]
    for place in environ.get("PIP_FIND_LINKS", "").split():
        out += ["--find-links", place]
    return out


def torch_sources(environ: Mapping[str, str]) -> list[str]:
    """pip_sources, and PyTorch's CPU index where no wheelhouse (PIP_FIND_LINKS) is configured."""
    local = pip_sources(environ)
    return local if "--find-links" in local else [*local, "--extra-index-url", TORCH_CPU_INDEX]


def uv_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for uv: pip's certificate bundle and network timeout where uv's own are unset."""
    env = dict(environ)
    if env.get("PIP_CERT") and not env.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = env["PIP_CERT"]
    if env.get("PIP_DEFAULT_TIMEOUT") and not env.get("UV_HTTP_TIMEOUT"):
        env["UV_HTTP_TIMEOUT"] = env["PIP_DEFAULT_TIMEOUT"]
    return env


def command(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The uv command line for `[--torch] UV ARGS...`: ARGS, then the sources."""
    args = list(argv)
    with_torch = bool(args) and args[0] == "--torch"
    if with_torch:
        args = args[1:]
    if len(args) < 3 or args[1:3] != ["pip", "install"]:
        raise SystemExit("usage: python3 ci/uv_pip.py [--torch] UV pip install ARGS...")
    return [*args, *(torch_sources(environ) if with_torch else pip_sources(environ))]


def main(argv: Sequence[str]) -> None:
    cmd = command(argv, os.environ)
    try:
        os.execvpe(cmd[0], cmd, uv_environment(os.environ))
    except OSError as exc:
        raise SystemExit(f"error: cannot run {cmd[0]}: {exc.strerror}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
