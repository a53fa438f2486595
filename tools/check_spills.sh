#!/usr/bin/env bash
# Fails when ptxas reported register spills in a build log (the CUDA kernels are compiled with -Xptxas -v):
#   bash tools/check_spills.sh build/install.log
# Used by tools/setup.sh (the development architectures) and tools/build_wheel.sh (the release list). A log
# of an incremental build holds only the files it recompiled; a log without any ptxas report passes.
# custom_ops/known_spills.txt lists spills that are known and accepted, exactly (architecture, kernel, bytes
# stored and loaded): they are printed, and any other spill, or a listed one that grew or shrank, fails.
set -euo pipefail
log=${1:?usage: check_spills.sh BUILD_LOG}
known="$(dirname "${BASH_SOURCE[0]}")/../custom_ops/known_spills.txt"
# ptxas prints "Compiling entry function 'NAME' for 'sm_XX'" before each kernel's spill line. grep -a: a log
# with binary bytes in it is still read as text.
spills=$(grep -a -e 'Compiling entry function' -e 'bytes spill stores' "$log" | awk '
  /Compiling entry function/ { match($0, /function .[^'"'"']*/); fn = substr($0, RSTART + 10, RLENGTH - 10)
                               match($0, /for .sm_[0-9a-z]*/); arch = substr($0, RSTART + 5, RLENGTH - 5) }
  /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ {
    match($0, /[0-9]+ bytes spill stores/); stores = substr($0, RSTART, RLENGTH) + 0
    match($0, /[0-9]+ bytes spill loads/); loads = substr($0, RSTART, RLENGTH) + 0
    print arch, fn, stores, loads }' || true)
failed=0
while read -r arch fn stores loads; do
  [[ -n $arch ]] || continue
  if [[ -f $known ]] && grep -qxF "$arch $fn $stores $loads" <(grep -v '^#' "$known"); then
    echo "known spill (custom_ops/known_spills.txt): $arch $fn: $stores bytes stored, $loads loaded"
  else
    echo "SPILL: $arch $fn: $stores bytes stored, $loads loaded" >&2
    failed=1
  fi
done <<<"$spills"
if ((failed)); then
  echo "CUDA kernels spill registers (see above; known ones are listed in custom_ops/known_spills.txt)" >&2
  # The build directory is incremental: without this, the next build would not recompile the spilling objects,
  # its log would hold no ptxas report, and the check would pass.
  dir=$(grep -a -o 'Build files have been written to: .*' "$log" | tail -n 1 | sed 's/^Build files have been written to: //' || true)
  if [[ -n $dir && -d $dir ]]; then
    find "$dir" -name '*.cu.o' -delete
    echo "removed the CUDA objects in $dir: the next build recompiles them and reports again" >&2
  fi
  exit 1
fi
count=$(grep -a -c 'bytes spill stores' "$log" || true)
archs=$(grep -a -o "for 'sm_[0-9a-z]*'" "$log" | sort -uV | tr -d "'" | sed 's/^for //' | tr '\n' ' ' || true)
echo "no other spills in $count kernel compilations${archs:+ (${archs% })}"
