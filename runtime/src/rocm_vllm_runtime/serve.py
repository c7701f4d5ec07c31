"""`serve`: start vLLM's OpenAI-compatible server with defaults for DeepSeek-class MLA models.

`build_argv(user_args, env)` is pure; `main()` execs the server. Like `vllm
serve`, a first argument that is not an option is the model. Settings fill in
only what the user's arguments leave out:

  SERVE_MODEL                    model path or Hugging Face id (default: the tiny
                                 dummy-weight MLA model at $TINY_MLA_MODEL)
  TINY_MLA_MODEL                 its directory (default /opt/rocm-vllm/models/tiny-mla);
                                 served with --load-format dummy --skip-tokenizer-init
                                 (--no-skip-tokenizer-init: with its tokenizer)
  SERVE_HOST / SERVE_PORT        --host / --port (default 0.0.0.0 / 8000)
  SERVE_TENSOR_PARALLEL_SIZE     --tensor-parallel-size
  SERVE_BLOCK_SIZE               --block-size
  SERVE_MAX_MODEL_LEN            --max-model-len
  SERVE_GPU_MEMORY_UTILIZATION   --gpu-memory-utilization
  SERVE_SERVED_MODEL_NAME        --served-model-name
  SERVE_ATTENTION_BACKEND        --attention-backend (empty: vLLM's own selection)
  SERVE_EXTRA_ARGS               further arguments, shell-quoted
The API key comes from vLLM's own VLLM_API_KEY (or --api-key); the start-up line masks it.

A server reachable from other machines needs an API key. The address that counts is the
one the port is published on when it is known (ROCM_VLLM_PUBLISHED_ADDRESS: compose sets it
from VLLM_BIND_ADDRESS; a server bound to a loopback --host is never reachable through it),
else --host itself (`docker run` with --network host or -p). Without a key on a
non-loopback address the launcher stops with one line, unless:
  ROCM_VLLM_ALLOW_NO_API_KEY=1   serve without a key anyway (0 or empty: refuse)
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from rocm_vllm_runtime.secret_values import secret_value_problem, shown

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TINY_MODEL_ENV = "TINY_MLA_MODEL"
DEFAULT_TINY_MODEL = "/opt/rocm-vllm/models/tiny-mla"
PUBLISHED_ENV = "ROCM_VLLM_PUBLISHED_ADDRESS"
ALLOW_NO_KEY_ENV = "ROCM_VLLM_ALLOW_NO_API_KEY"
API_KEY_ENV = "VLLM_API_KEY"
LOG_PREFIX = "[rocm-vllm]"
HF_TOKEN_ENVS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class ServeError(Exception):
    """A setting that stops the launcher; the message is one line naming it."""

# (environment variable, option, default)
_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("SERVE_HOST", "--host", "0.0.0.0"), ("SERVE_PORT", "--port", "8000"),
    ("SERVE_TENSOR_PARALLEL_SIZE", "--tensor-parallel-size", ""), ("SERVE_BLOCK_SIZE", "--block-size", ""),
    ("SERVE_MAX_MODEL_LEN", "--max-model-len", ""), ("SERVE_GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization", ""),
    ("SERVE_SERVED_MODEL_NAME", "--served-model-name", ""), ("SERVE_ATTENTION_BACKEND", "--attention-backend", ""),
)


def tiny_model(env: Mapping[str, str]) -> str:
    return env.get(TINY_MODEL_ENV) or DEFAULT_TINY_MODEL


def _given(args: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


def option_value(args: Sequence[str], option: str) -> str | None:
    """The value vLLM takes for option: the last one given (its argument parser's rule)."""
    found = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
    return found


def build_argv(user_args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Arguments for the API server module (without the interpreter)."""
    args = list(user_args)
    if args and not args[0].startswith("-"):
        args = ["--model", args[0], *args[1:]]
    try:
        extra = shlex.split(env.get("SERVE_EXTRA_ARGS", ""))
    except ValueError as exc:
        raise ServeError(f"SERVE_EXTRA_ARGS cannot be split as shell words ({exc}): fix its quoting") from None
    given = args + extra
    defaults: list[str] = []
    model = option_value(given, "--model")
    if model is None:
        model = env.get("SERVE_MODEL") or tiny_model(env)
        defaults += ["--model", model]
    if os.path.normpath(model) == os.path.normpath(tiny_model(env)):
        if not _given(given, "--load-format"):
            defaults += ["--load-format", "dummy"]
        if not (_given(given, "--skip-tokenizer-init") or _given(given, "--no-skip-tokenizer-init")):
            defaults += ["--skip-tokenizer-init"]
    for var, option, default in _OPTIONS:
        value = env.get(var) or default
        if value and not _given(given, option):
            defaults += [option, value]
    return defaults + extra + args


def _option_values(args: Sequence[str], option: str, *, many: bool = False) -> list[str]:
    """Values of `option` (--opt VALUE, --opt=VALUE); many: every value up to the next option
    (vLLM's --api-key takes one or more)."""
    values: list[str] = []
    taking = 0  # values still to take: 1, or -1 for "every value up to the next option"
    for arg in args:
        if arg.startswith(option + "="):
            values.append(arg.split("=", 1)[1])
            taking = 0
        elif arg == option:
            taking = -1 if many else 1
        elif taking and not (many and arg.startswith("-")):
            values.append(arg)
            taking = -1 if many else 0
        else:
            taking = 0
    return values


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or an empty --host (every address): counts as reachable


def exposure(server_args: Sequence[str], env: Mapping[str, str]) -> str:
    """'' when serving is allowed; else the reason as one line. Warnings start with 'warning:'."""
    allow = env.get(ALLOW_NO_KEY_ENV, "")
    if allow not in ("", "0", "1"):
        raise ServeError(f"{ALLOW_NO_KEY_ENV}={shlex.quote(allow)} is not one of its values: set 1 to serve "
                         "without an API key on a reachable address, or 0 (or leave it empty) to refuse")
    host = option_value(server_args, "--host") or ""
    published = env.get(PUBLISHED_ENV, "").strip()
    address = published or host
    if is_loopback(host) or is_loopback(address):
        return ""
    if env.get(API_KEY_ENV) or any(_option_values(server_args, "--api-key", many=True)):
        return ""
    where = (f"{address or 'every address'} (" + (f"published there: {PUBLISHED_ENV}, from "
             "VLLM_BIND_ADDRESS" if published else "--host / SERVE_HOST") + ")")
    if allow == "1":
        return (f"warning: serving without an API key on {where}: anyone who reaches it can use "
                f"the server ({ALLOW_NO_KEY_ENV}=1)")
    raise ServeError(f"refusing to serve without an API key on {where}: set {API_KEY_ENV}, "
                     "publish on 127.0.0.1 (VLLM_BIND_ADDRESS) or bind --host/SERVE_HOST to "
                     f"127.0.0.1, or set {ALLOW_NO_KEY_ENV}=1 to serve without a key anyway")


def check_api_keys(server_args: Sequence[str], env: Mapping[str, str]) -> None:
    """ServeError, in one line that never shows a secret, when an API key or a Hugging Face token
    cannot be what it is meant to be: wrapped in quotes an env file kept, or holding what an HTTP
    header cannot carry. Either way every client (or every download) would be refused."""
    keys = [(API_KEY_ENV, "the API key", env.get(API_KEY_ENV, ""))]
    keys += [("--api-key", "the API key", k) for k in _option_values(server_args, "--api-key", many=True)]
    keys += [(name, "the Hugging Face token", env.get(name, "")) for name in HF_TOKEN_ENVS]
    keys += [("--hf-token", "the Hugging Face token", t) for t in _option_values(server_args, "--hf-token")]
    for where, what, key in keys:
        why = secret_value_problem(key, what) if key else ""
        if why:
            raise ServeError(f"{where}: {why}")


def main(argv: Sequence[str] | None = None) -> int:
    user_args = list(sys.argv[1:] if argv is None else argv)
    try:
        server_args = build_argv(user_args, os.environ)
        check_api_keys(server_args, os.environ)
        warning = exposure(server_args, os.environ)
    except ServeError as exc:
        print(f"{LOG_PREFIX} error: {exc}", file=sys.stderr, flush=True)
        return 1
    if warning:
        print(f"{LOG_PREFIX} {warning}", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", SERVER_MODULE, *server_args]
    print(f"{LOG_PREFIX} serve: " + shown(command[1:]), file=sys.stderr, flush=True)
    os.execv(sys.executable, command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
