# Sourced by the source scripts (aiter_source.sh, vllm_source.sh), which define fail and warn.
#
#   check_pin NAME VALUE COMPONENT   VALUE must be a full 40-hex commit, or UNRESOLVED when
#                                    ALLOW_UNRESOLVED=1 (COMPONENT names the ci.pins resolve target)
check_pin() {
  case "$2" in
    UNRESOLVED)
      [ "${ALLOW_UNRESOLVED:-0}" = 1 ] || fail "$1 is UNRESOLVED in versions.json: run 'python3 -m ci.pins resolve $3 --write' on a connected machine, or build with ALLOW_UNRESOLVED=1 (development image)"
      warn "$1 is UNRESOLVED; ALLOW_UNRESOLVED=1 records the commit found instead (not a release build)" ;;
    *) [[ "$2" =~ ^[0-9a-f]{40}$ ]] || fail "$1='$2' is not a full 40-hex commit: fix it in versions.json" ;;
  esac
}
