# Sourced by the build scripts and by Dockerfile RUN steps; defines functions only.
#
#   check_pin NAME VALUE COMPONENT
#                            VALUE UNRESOLVED (a null pin) stops the step, naming NAME and the
#                            tools.pins resolve target COMPONENT, unless ALLOW_UNRESOLVED=1 (then a
#                            warning); the caller defines fail and warn
#   use_ca_bundle            point pip, git and Python's HTTPS clients at the build secret
#                            "ca-bundle" when mounted (TLS-inspecting proxies)
#   derive_max_jobs NAME PER_JOB_VAR
#                            set and export MAX_JOBS (unless given) from the CPUs and memory this
#                            build may use, PER_JOB_VAR GiB per compile job; print one line; exit
#                            when one job does not fit
#
# Environment: MAX_JOBS (given: kept, checked against memory), ROCM_VLLM_CA_BUNDLE (default
# /run/secrets/ca-bundle), ROCM_VLLM_CGROUP_DIR (/sys/fs/cgroup), ROCM_VLLM_MEMINFO (/proc/meminfo).

check_pin() {
  [ "$2" = UNRESOLVED ] || return 0
  [ "${ALLOW_UNRESOLVED:-0}" = 1 ] || fail "$1 is UNRESOLVED in versions.json: run 'python3 -m tools.pins resolve $3 --write' on a connected machine, or build with ALLOW_UNRESOLVED=1 (development image)"
  warn "$1 is UNRESOLVED; ALLOW_UNRESOLVED=1 records the commit found instead (not a release build)"
}

use_ca_bundle() {
  local bundle=${ROCM_VLLM_CA_BUNDLE:-/run/secrets/ca-bundle}
  if [ -f "$bundle" ]; then
    export PIP_CERT=$bundle GIT_SSL_CAINFO=$bundle REQUESTS_CA_BUNDLE=$bundle SSL_CERT_FILE=$bundle
  fi
}

# CPUs this process may use: the affinity mask (nproc), lowered by a cgroup v2 CPU quota.
_lib_cpus() {
  local cpus quota period dir=${ROCM_VLLM_CGROUP_DIR:-/sys/fs/cgroup}
  cpus=$(nproc)
  if [ -r "$dir/cpu.max" ]; then
    read -r quota period <"$dir/cpu.max" || true
    if [ -n "$quota" ] && [ "$quota" != max ] && [ "${period:-0}" -gt 0 ]; then
      quota=$(( (quota + period - 1) / period ))
      [ "$quota" -lt "$cpus" ] && cpus=$quota
    fi
  fi
  echo "$cpus"
}

# Memory this process may use, in KiB: MemAvailable, lowered by the cgroup limit minus its usage
# (cgroup v2 memory.max/memory.current, or v1 memory.limit_in_bytes/memory.usage_in_bytes).
_lib_mem_kib() {
  local dir=${ROCM_VLLM_CGROUP_DIR:-/sys/fs/cgroup} mem limit usage pair
  mem=$(awk '/^MemAvailable:/ {print $2}' "${ROCM_VLLM_MEMINFO:-/proc/meminfo}")
  for pair in "memory.max memory.current" "memory/memory.limit_in_bytes memory/memory.usage_in_bytes"; do
    set -- $pair
    [ -r "$dir/$1" ] || continue
    limit=$(cat "$dir/$1")
    case "$limit" in max|'') continue ;; esac
    usage=0
    [ -r "$dir/$2" ] && usage=$(cat "$dir/$2")
    limit=$(( (limit - usage) / 1024 ))
    [ "$limit" -lt 0 ] && limit=0
    [ "$limit" -lt "$mem" ] && mem=$limit
  done
  echo "$mem"
}

derive_max_jobs() {
  local name=$1 per_var=$2 per_job cpus mem_gib by_mem how
  per_job=${!per_var:-4}
  case "$per_job" in ''|*[!0-9]*|0) echo "$name: ERROR: $per_var='$per_job' must be a positive whole number of GiB" >&2; exit 1 ;; esac
  cpus=$(_lib_cpus)
  mem_gib=$(( $(_lib_mem_kib) / 1024 / 1024 ))
  by_mem=$(( mem_gib / per_job ))
  if [ -z "${MAX_JOBS:-}" ]; then
    MAX_JOBS=$(( by_mem < cpus ? by_mem : cpus ))
    how=derived
  else
    case "$MAX_JOBS" in *[!0-9]*) echo "$name: ERROR: MAX_JOBS='$MAX_JOBS' must be a whole number (or empty: derived)" >&2; exit 1 ;; esac
    how=given
  fi
  echo "$name: MAX_JOBS=$MAX_JOBS ($how; builder: $cpus CPUs, $mem_gib GiB usable, $per_var=$per_job)"
  if [ "$by_mem" -lt 1 ] || [ "$MAX_JOBS" -lt 1 ]; then
    echo "$name: ERROR: the builder has $mem_gib GiB usable, less than one compile job needs ($per_job GiB, $per_var): give the builder more memory" >&2
    exit 1
  fi
  if [ "$MAX_JOBS" -gt "$by_mem" ]; then
    echo "$name: WARNING: MAX_JOBS=$MAX_JOBS exceeds what memory allows ($by_mem jobs of $per_job GiB); expect OOM" >&2
  fi
  export MAX_JOBS
}
