#!/usr/bin/env bash
# The GPU run (the GPU-run issue), in stages, each one `run` of the device tool from the repository root,
# with results written under $OUT (default ./gpu-out). Prepare here first: bash tools/device/prepare.sh
#
#   1. bash tools/device/run_gpu.sh kernels      carry [".gpucarry/wheels"]          (~6 min on an H200)
#      the kernel check: tools/gpu_check.py builds the kernels for the GPU's own arch with nvcc, checks every
#      op x dtype x shape (hidden 1..262144, odd sizes, misaligned, in-place, 1..70000 rows, rows split over a
#      thread-block cluster and the same shapes with clusters off) against the reference, CUDA graph capture
#      of every kernel path (cluster launches included), and GB/s against a device-to-device copy, torch and
#      a one-row-per-program Triton kernel, plus ours with clusters off where the launcher splits rows (few or
#      wide rows). The bandwidth table stops growing at --budget (420 s), inside the 480 s timeout.
#      Tables: $OUT/gpu_check.md and .json.
#   2. once per part: bash tools/device/run_gpu.sh receive   carry [".ortgpu/part-NN"]   (seconds each)
#      Ignored files already on the machine stay between calls while it is warm, so the parts add up there;
#      naming all of .ortgpu in one carry would exceed the 64 MiB a transfer takes.
#   3. bash tools/device/run_gpu.sh ort          carry [".gpucarry", ".ortgpu/install.sh"]   (~5 min)
#      installs onnxruntime-gpu from the parts, preload_dlls(), loads our library (rebuilds it for sm_90 there
#      if the carried one does not load), then: our ops through ONNX Runtime's CUDA provider against the
#      reference, against ONNX Runtime's LayerNorm/SkipLayerNorm/SimplifiedLayerNorm kernels (CUDA graphs off
#      and on), parity of the bundled examples on CUDA, and `onnx-norm bench --provider cuda`.
#   .gpucarry is about 55 MB (the library with SASS for 5 architectures is 46 MB): carry nothing else with it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stage=${1:-kernels}

python_deps() {
  # onnx / ml_dtypes from the carried wheels, only where the machine lacks them.
  if ! python3 -c 'import onnx, ml_dtypes' 2>/dev/null && compgen -G '.gpucarry/wheels/*.whl' >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target .gpucarry/site .gpucarry/wheels/*.whl
  fi
  export PYTHONPATH=$PWD:$PWD/.gpucarry/site${PYTHONPATH:+:$PYTHONPATH}
}

environment() {
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -n 2
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  } 2>&1 | tee "$OUT/environment.txt"
}

library() {
  # The carried library if it loads with the CUDA provider's runtime, else a build for sm_90 here.
  cp .gpucarry/libonnx_norm_ops.so onnx_norm/ 2>/dev/null
  if python3 -c 'import ctypes, onnx_norm.library as l; ctypes.CDLL(l.get_library_path())' 2>"$OUT/library.log"; then
    echo "custom-op library: the carried build loads"
    return 0
  fi
  echo "custom-op library: carried build missing or not loadable ($(tail -n 1 "$OUT/library.log")); building for sm_90"
  cmake -S custom_ops -B build/gpu -DCMAKE_BUILD_TYPE=Release -DONNX_NORM_CUDA_ARCHITECTURES=90-real \
    -DONNX_NORM_ORT_INCLUDE_DIR="$PWD/.gpucarry/ort-include" >"$OUT/library-build.log" 2>&1 &&
    cmake --build build/gpu -j 16 >>"$OUT/library-build.log" 2>&1 &&
    cp "$(find build/gpu -name 'libonnx_norm_ops.so' | head -n 1)" onnx_norm/ ||
    { echo "library build failed: $OUT/library-build.log"; return 1; }
}

# The onnx-norm command, from this checkout.
CLI=(python3 -c 'import sys; from onnx_norm.cli import main; sys.exit(main(sys.argv[1:]))')

case $stage in
  kernels)
    environment
    python_deps
    timeout 480 python3 tools/gpu_check.py --no-ort --out "$OUT" --build-dir build/harness 2>&1 | tee "$OUT/kernels.log"
    exit "${PIPESTATUS[0]}"
    ;;
  receive)
    ls -la .ortgpu/
    ;;
  ort)
    environment
    python_deps
    bash .ortgpu/install.sh 2>&1 | tee "$OUT/ort-install.log" || exit 1
    export PYTHONPATH=$PWD/.ortgpu/site:$PYTHONPATH
    python3 -c 'import onnxruntime as o; o.preload_dlls()'
    library || exit 1
    status=0
    timeout 240 python3 tools/gpu_check.py --ort-only --out "$OUT" 2>&1 | tee "$OUT/ort.log" || status=1
    for model in examples/*.onnx; do
      name=$(basename "$model" .onnx)
      "${CLI[@]}" optimize "$model" "build/$name.fused.onnx" >>"$OUT/examples.log" 2>&1 &&
        "${CLI[@]}" verify "$model" "build/$name.fused.onnx" --provider cuda >>"$OUT/examples.log" 2>&1 ||
        { echo "FAIL $name (see examples.log)"; status=1; }
    done
    for model in examples/llama-rmsnorm-fp16.onnx examples/bert-layernorm-opset13.onnx; do
      timeout 120 "${CLI[@]}" bench "$model" --provider cuda 2>&1 | tee -a "$OUT/bench.log" || status=1
    done
    exit $status
    ;;
  *)
    echo "usage: $0 kernels|receive|ort" >&2
    exit 2
    ;;
esac
