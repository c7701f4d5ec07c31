#!/usr/bin/env bash
# The image's ENTRYPOINT.
#
#   serve [MODEL] [VLLM_ARGS...]   OpenAI-compatible server (default command)
#   selftest [SUITE] [OPTIONS...]  the in-image self-tests (selftest --help)
#   anything else                  executed as given
#
# The commands are modules of the installed runtime package rocm_vllm_runtime
# (runtime). First its guard (python3 -m rocm_vllm_runtime.guard) checks the
# GPUs against the archs the image was built for and decides VLLM_ROCM_USE_AITER
# and AITER_JIT_DIR; its decisions are exported here, then the command runs.
# `serve` stops with one error line when no usable GPU is found, or a render
# node under /dev/dri cannot be opened (ROCM_VLLM_REQUIRE_GPU=0 skips the check
# for CPU runs), and when it would listen on a reachable address without an
# API key (ROCM_VLLM_ALLOW_NO_API_KEY=1 allows it). A setting with a value
# outside its documented ones stops every command with one line.
set -euo pipefail

python=${ROCM_VLLM_PYTHON:-python3}

if [ "$#" -eq 0 ]; then
  set -- serve
fi
case "$1" in
  serve) mode=serve ;;
  selftest) mode=selftest ;;
  *) mode=exec ;;
esac

decisions=$("$python" -m rocm_vllm_runtime.guard --mode "$mode") || exit $?
eval "$decisions"

case "$1" in
  serve) shift; exec "$python" -m rocm_vllm_runtime.serve "$@" ;;
  selftest) shift; exec "$python" -m rocm_vllm_runtime "$@" ;;
  *) exec "$@" ;;
esac
