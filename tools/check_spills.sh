#!/usr/bin/env bash
# Fails when ptxas reported register spills in a build log (the CUDA kernels are compiled with -Xptxas -v):
#   bash tools/check_spills.sh build/install.log
# Used by tools/setup.sh (the development architectures) and tools/build_wheel.sh (the release list). A log
# of an incremental build holds only the files it recompiled; a log without any ptxas report passes.
set -euo pipefail
log=${1:?usage: check_spills.sh BUILD_LOG}
# ptxas prints "Compiling entry function 'NAME' for 'sm_XX'" before each kernel's spill line.
spills=$(awk "/Compiling entry function/ { fn = \$0 } /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ { print fn; print }" "$log")
if [[ -n $spills ]]; then
  echo "$spills"
  echo "CUDA kernels spill registers (see above)" >&2
  exit 1
fi
count=$(grep -c 'bytes spill stores' "$log" || true)
archs=$(grep -o "for 'sm_[0-9a-z]*'" "$log" | sort -uV | tr -d "'" | sed 's/^for //' | tr '\n' ' ' || true)
echo "no spills in $count kernel compilations${archs:+ (${archs% })}"
