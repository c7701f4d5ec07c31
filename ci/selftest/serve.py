"""`serve`: start vLLM's OpenAI-compatible server with defaults for DeepSeek-class MLA models.

`build_argv(user_args, env)` is pure; `main()` execs the server. Like `vllm
serve`, a first argument that is not an option is the model. Settings fill in
only what the user's arguments leave out:

  SERVE_MODEL                    model path or Hugging Face id (default: the tiny
                                 dummy-weight MLA model at $TINY_MLA_MODEL)
  TINY_MLA_MODEL                 its directory (default /opt/rocm-vllm/models/tiny-mla);
                                 served with --load-format dummy --skip-tokenizer-init
  SERVE_HOST / SERVE_PORT        --host / --port (default 0.0.0.0 / 8000)
  SERVE_TENSOR_PARALLEL_SIZE     --tensor-parallel-size
  SERVE_BLOCK_SIZE               --block-size
  SERVE_MAX_MODEL_LEN            --max-model-len
  SERVE_GPU_MEMORY_UTILIZATION   --gpu-memory-utilization
  SERVE_SERVED_MODEL_NAME        --served-model-name
  SERVE_ATTENTION_BACKEND        --attention-backend (empty: vLLM's own selection)
  SERVE_EXTRA_ARGS               further arguments, shell-quoted
The API key comes from vLLM's own VLLM_API_KEY.
"""
from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TINY_MODEL_ENV = "TINY_MLA_MODEL"
DEFAULT_TINY_MODEL = "/opt/rocm-vllm/models/tiny-mla"

# (environment variable, option, default)
_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("SERVE_HOST", "--host", "0.0.0.0"),
    ("SERVE_PORT", "--port", "8000"),
    ("SERVE_TENSOR_PARALLEL_SIZE", "--tensor-parallel-size", ""),
    ("SERVE_BLOCK_SIZE", "--block-size", ""),
    ("SERVE_MAX_MODEL_LEN", "--max-model-len", ""),
    ("SERVE_GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization", ""),
    ("SERVE_SERVED_MODEL_NAME", "--served-model-name", ""),
    ("SERVE_ATTENTION_BACKEND", "--attention-backend", ""),
)


def tiny_model(env: Mapping[str, str]) -> str:
    return env.get(TINY_MODEL_ENV) or DEFAULT_TINY_MODEL


def _given(args: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


def _option_value(args: Sequence[str], option: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def build_argv(user_args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Arguments for the API server module (without the interpreter)."""
    args = list(user_args)
    if args and not args[0].startswith("-"):
        args = ["--model", args[0], *args[1:]]
    extra = shlex.split(env.get("SERVE_EXTRA_ARGS", ""))
    given = args + extra
    defaults: list[str] = []
    model = _option_value(given, "--model")
    if model is None:
        model = env.get("SERVE_MODEL") or tiny_model(env)
        defaults += ["--model", model]
    if os.path.normpath(model) == os.path.normpath(tiny_model(env)):
        if not _given(given, "--load-format"):
            defaults += ["--load-format", "dummy"]
        if not _given(given, "--skip-tokenizer-init"):
            defaults += ["--skip-tokenizer-init"]
    for var, option, default in _OPTIONS:
        value = env.get(var) or default
        if value and not _given(given, option):
            defaults += [option, value]
    return defaults + extra + args


def main(argv: Sequence[str] | None = None) -> int:
    user_args = list(sys.argv[1:] if argv is None else argv)
    server_args = build_argv(user_args, os.environ)
    command = [sys.executable, "-m", SERVER_MODULE, *server_args]
    print("[rocm-vllm] serve: " + shlex.join(command[1:]), file=sys.stderr, flush=True)
    os.execv(sys.executable, command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
