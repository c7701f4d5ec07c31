#!/usr/bin/env bash
# TheRock's SDK as vLLM's own TheRock base arranges it after `rocm-sdk init`, so that one copy of
# each ROCm runtime library is loaded:
#   - a library both SDK folders ship (libamdhip64.so*, the rocprofiler-sdk/-register/-roctx
#     libraries) is kept in the devel tree (ROCM_PATH) and the core's copy becomes a link to it;
#   - librocm_smi64.so.7, which ROCm 7 builds link against, is a link to the core's .so.1;
#   - ROCM_PATH/lib and the core's lib are the dynamic loader's (ld.so.conf.d, ldconfig), for
#     programs started without LD_LIBRARY_PATH;
#   - the SDK's Python loader (rocm_sdk) loads its libraries without RTLD_GLOBAL, so they do not
#     take the place of torch's own symbols.
# Each change is printed; a file that is not there is left alone (another SDK release).
#
#   therock_links.sh        (reads ROCM_PATH and SDK_CORE, which the therock stage sets)
set -euo pipefail
: "${ROCM_PATH:?the therock stage sets ROCM_PATH}" "${SDK_CORE:?the therock stage sets SDK_CORE}"
dev=$ROCM_PATH/lib core=$SDK_CORE/lib
say() { echo "therock-links: $*"; }
link() {  # link TARGET NAME: NAME (a file) becomes a link to TARGET
  ln -sfn "$1" "$2"
  say "$2 -> $1"
}
for path in "$core"/libamdhip64.so* "$core"/librocprofiler-sdk.so.1 "$core"/librocprofiler-register.so.0 \
            "$core"/librocprofiler-sdk-roctx.so.1; do
  name=$(basename "$path")
  if [ -f "$path" ] && [ ! -L "$path" ] && [ -f "$dev/$name" ]; then
    link "$dev/$name" "$path"
  fi
done
if [ -f "$core/librocm_smi64.so.1" ] && [ ! -e "$dev/librocm_smi64.so.7" ]; then
  link "$core/librocm_smi64.so.1" "$dev/librocm_smi64.so.7"
fi
printf '%s\n%s\n' "$dev" "$core" >/etc/ld.so.conf.d/rocm-sdk.conf
ldconfig
say "loader paths: $dev $core"
loader=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/rocm_sdk/__init__.py
if [ -f "$loader" ] && grep -q 'rtld_global: bool = True' "$loader"; then
  sed -i 's/rtld_global: bool = True/rtld_global: bool = False/' "$loader"
  say "$loader: rtld_global defaults to False"
fi
