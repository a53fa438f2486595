#!/usr/bin/env bash
# Run HERE (the machine with a package index), from the repository root, before the GPU run: fills
# .gpucarry/ (git-ignored through .git/info/exclude) with what the GPU machine cannot fetch, for `carry`:
#   - the custom-op library built by tools/setup.sh (CUDA kernels for sm_80..sm_90 + PTX);
#   - the ONNX Runtime C/C++ API headers the build used (to rebuild the library there for sm_90 if it
#     does not load);
#   - Python 3.12 wheels of the dependencies that a bare GPU machine may lack (onnx, ml_dtypes, onnx-ir, and
#     rich with its own, which every `onnx-norm` command imports), each installed there only if missing.
# Then, for onnxruntime-gpu (about 245 MiB, more than one transfer carries):
#   bash ../shared/tools/ort-gpu-parts.sh   (writes .ortgpu/part-* and .ortgpu/install.sh; send each part in
#   its own run, as tools/device/run_gpu.sh's header says)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CARRY=.gpucarry
rm -rf "$CARRY"
mkdir -p "$CARRY/wheels"
grep -qx '/.gpucarry/' .git/info/exclude 2>/dev/null || echo '/.gpucarry/' >>"$(git rev-parse --git-path info/exclude)"

library=$(.venv/bin/python -c 'import onnx_norm.library as l; print(l.get_library_path())')
cp "$library" "$CARRY/"
headers=$(dirname "$(find build -path '*onnxruntime/onnxruntime_c_api.h' | head -n 1)")
[[ -d $headers ]] || { echo "no ONNX Runtime headers under build/: run tools/setup.sh first" >&2; exit 1; }
cp -r "$headers" "$CARRY/ort-include"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$CARRY/wheels" onnx ml_dtypes onnx-ir rich markdown-it-py mdurl pygments
du -sh "$CARRY"
echo "carry: see the header of tools/device/run_gpu.sh (kernels: .gpucarry/wheels; ort: .gpucarry)"
