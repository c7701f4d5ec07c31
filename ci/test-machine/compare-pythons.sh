#!/usr/bin/env bash
# CPU seconds (user + system) of the same test work under the Pythons of two test environments, run
# in turn, and the ratio of their sums (what ci/test-machine/python.sh's choice rests on):
#
#   bash ci/test-machine/compare-pythons.sh PYTHON_A PYTHON_B [ROUNDS]
#
# PYTHON_A, PYTHON_B: the python of two test venvs made from the same tests/requirements.lock by
# different interpreters (.ci/run keeps each in its cache folder, keyed by its Python). The work: importing
# vLLM's API server, collecting every test, and one engine test file (vLLM's CPU engine serving the tiny
# model, backend/tests/engine/test_cpu_selection.py). Nothing is timed in the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 PYTHON_A PYTHON_B [ROUNDS]" >&2; exit 2; }
a=$1 b=$2 rounds=${3:-2}
case "$rounds" in [1-9]|[1-9][0-9]) ;; *) echo "error: ROUNDS='$rounds' is not a whole number from 1 to 99" >&2; exit 2 ;; esac
for py in "$a" "$b"; do
  [ -f "$py" ] && [ -x "$py" ] || { echo "error: $py is not an executable file (the python of a test venv)" >&2; exit 2; }
done
cpu() { /usr/bin/time -f "%U %S" "$@" 2>&1 >/dev/null | tail -n 1 | awk '{printf "%.2f", $1 + $2}'; }
declare -A sum=([a]=0 [b]=0)
for work in import collect engine; do
  for ((round = 1; round <= rounds; round++)); do
    for side in a b; do
      py=${!side}
      case $work in
        import) t=$(cpu "$py" -c "import vllm.entrypoints.openai.api_server") ;;
        collect) t=$(cpu "$py" -m pytest --collect-only -q -p no:cacheprovider) ;;
        engine) t=$(cpu "$py" -m pytest -q -p no:cacheprovider backend/tests/engine/test_cpu_selection.py) ;;
      esac
      sum[$side]=$(awk -v s="${sum[$side]}" -v t="$t" 'BEGIN {printf "%.2f", s + t}')
      echo "$work, round $round, $side ($("$py" --version 2>&1)): $t s"
    done
  done
done
awk -v a="${sum[a]}" -v b="${sum[b]}" 'BEGIN {printf "in all: a %.1f s, b %.1f s, b/a %.3f\n", a, b, b / a}'
