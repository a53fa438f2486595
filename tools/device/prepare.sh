#!/usr/bin/env bash
# Run HERE (the machine with a package index), from the repository root, after tools/setup.sh and before the GPU
# run. Fills .gpucarry/ (git-ignored through .git/info/exclude) with what the GPU machine cannot fetch:
#   - the custom-op library built for the GPU's architecture only (GPU_ARCH, default 90: the lent machine is an
#     H200). The wheel's library, with SASS for five architectures, is over 55 MB and would not fit one call's
#     64 MiB beside the rest; the sm_90 one is about 15 MB, built in under a minute (build/gpu-carry);
#   - the kernel check's harness (tools/gpu_harness) built for the same arch;
#   - the ONNX Runtime C/C++ API headers the build used (to rebuild the library there if it does not load);
#   - Python 3.12 wheels of the dependencies that a bare GPU machine may lack (onnx, ml_dtypes, onnx-ir, and
#     rich with its own, which every `onnx-norm` command imports), each installed there only if missing.
# Then, unless .ortgpu/install.sh is there already, the onnxruntime-gpu wheel in parts (ORT_GPU_PARTS, default
# ../shared/tools/ort-gpu-parts.sh, writes .ortgpu/part-* and .ortgpu/install.sh), and last the calls of
# tools/device/run_gpu.sh with what each one transfers (the working tree travels with every call): exit 1 when
# one is over 64 MiB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CARRY=.gpucarry
ARCH=${GPU_ARCH:-90}
LIMIT=$((64 << 20))
rm -rf "$CARRY"
mkdir -p "$CARRY/wheels"
grep -qx '/.gpucarry/' .git/info/exclude 2>/dev/null || echo '/.gpucarry/' >>"$(git rev-parse --git-path info/exclude)"

headers=$(dirname "$(find "$PWD/build" -path '*onnxruntime/onnxruntime_c_api.h' | head -n 1)")
[[ -d $headers ]] || { echo "no ONNX Runtime headers under build/: run tools/setup.sh first" >&2; exit 1; }
cp -r "$headers" "$CARRY/ort-include"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ -f build/gpu-carry/CMakeCache.txt ]] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}$" \
  build/gpu-carry/CMakeCache.txt; then
  rm -rf build/gpu-carry # configured with another generator (cmake refuses to switch)
fi
cmake -S custom_ops -B build/gpu-carry "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DONNX_NORM_CUDA_ARCHITECTURES="$ARCH-real" -DONNX_NORM_ORT_INCLUDE_DIR="$headers" >build/gpu-carry.log
grep -q "building CUDA kernels" build/gpu-carry.log ||
  { echo "no CUDA in the sm_$ARCH build (nvcc not found?): see build/gpu-carry.log" >&2; exit 1; }
cmake --build build/gpu-carry -j "$(nproc)" >>build/gpu-carry.log
cp build/gpu-carry/libonnx_norm_ops.so "$CARRY/"
# The kernel check's harness for the same arch (tools/gpu_check.py reuses it there while the sources match its
# stamp; 6 MB; saves the GPU machine's nvcc build). Kept in build/gpu-harness between runs of this script.
.venv/bin/python - "$ARCH" <<'PY' >>build/gpu-carry.log
import sys
from pathlib import Path

sys.path[:0] = ["tools/gpu_harness", "."]
from gpu_build import build_harness, find_nvcc

print(build_harness(find_nvcc(None), sys.argv[1], Path("build/gpu-harness")))
PY
mkdir -p "$CARRY/harness"
cp build/gpu-harness/libonnx_norm_harness.{so,stamp} "$CARRY/harness/"

python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$CARRY/wheels" onnx ml_dtypes onnx-ir rich markdown-it-py mdurl pygments

if [[ ! -f .ortgpu/install.sh ]]; then
  splitter=${ORT_GPU_PARTS:-../shared/tools/ort-gpu-parts.sh}
  [[ -f $splitter ]] || { echo "no $splitter: make .ortgpu/ (the onnxruntime-gpu wheel in parts) first" >&2; exit 1; }
  bash "$splitter"
fi

# What each call transfers: the working tree (tracked and untracked, not ignored) plus its carry.
bytes() { du -cb "$@" | tail -n 1 | cut -f 1; }
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -n 1 | cut -f 1)
mapfile -t parts < <(ls .ortgpu/part-*)
last=${parts[-1]}
calls=("kernels|.gpucarry/wheels .gpucarry/harness $last")
for part in "${parts[@]:0:${#parts[@]}-1}"; do
  calls+=("receive|$part")
done
calls+=("ort models|.gpucarry .ortgpu/install.sh")
status=0
printf '%-40s %-45s %s\n' "call" "carry" "MiB (with the tree)"
for call in "${calls[@]}"; do
  stage=${call%%|*}
  read -ra carry <<<"${call#*|}"
  total=$((tree + $(bytes "${carry[@]}")))
  mark=""
  ((total <= LIMIT)) || { mark="  OVER 64 MiB"; status=1; }
  printf '%-40s %-45s %6.1f%s\n' "run_gpu.sh $stage" "${carry[*]}" "$(awk -v b="$total" 'BEGIN { print b / 1048576 }')" "$mark"
done
exit $status
