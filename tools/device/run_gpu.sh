#!/usr/bin/env bash
# The GPU run (the GPU-run issue): stages, each call one `run` of the device tool from the repository root, with
# results written under $OUT (default ./gpu-out; the device tool gives each call an empty one). Several stages may
# share a call: `bash tools/device/run_gpu.sh ort models`.
#
# Prepare here first: bash tools/device/prepare.sh (fills .gpucarry/ with a library built for the GPU's sm_90, the
# ORT headers and wheels; runs ../shared/tools/ort-gpu-parts.sh for .ortgpu/; prints the calls below with what
# each one transfers, and fails if one is over the 64 MiB a call carries).
#
# Device time is 15 minutes in all, the machine's start and idle waits included, a rerun included: the stages are
# bounded by deadlines, write their results as they go, and the calls follow back to back (a warm machine goes
# back after ~30 s idle, and a fresh one loses what the earlier calls left). Estimates, not yet measured:
#
#   call  command                                   carry                                    limit  estimate
#   1     run_gpu.sh kernels                        .gpucarry/wheels, .gpucarry/harness,     260 s  ~3.5 min
#                                                   .ortgpu/<last part>
#   2..   run_gpu.sh receive (one per other part)   .ortgpu/part-NN                            60 s  ~15 s each
#   last  run_gpu.sh ort models                     .gpucarry, .ortgpu/install.sh             600 s  ~7 min
#   then  give_back                                 (the idle wait counts)
#   here  python tools/device/summarize.py LAST_CALL_FOLDER KERNELS_CALL_FOLDER --output build/gpu-summary.md
#         (the goals judged from both calls' tables, the whole-model table, the examples, the commands)
#
#   kernels  tools/gpu_check.py takes the harness prepare.sh built for sm_90 (or builds the kernels for the GPU's
#            own arch with nvcc when the sources changed since or the arch differs), checks every op x dtype x
#            shape (hidden 1..262144, odd sizes, misaligned, in-place, 1..70000 rows, rows split over a
#            thread-block cluster and the same shapes with clusters off; each row op's cases, its
#            tools/gpu_harness/<op>_check.py listed in row_op_checks.py's CHECKS, through the same harness) against
#            the reference, CUDA graph capture of every kernel path (cluster launches included), then GB/s against
#            a device-to-device copy, torch and a one-row-per-program Triton kernel (plus ours with clusters off
#            where the launcher splits rows), the goal shapes in 16-bit types first, until KERNEL_BUDGET seconds
#            (default 170) from its start, then 30 s of the sweep across the cluster thresholds; killed at
#            KERNEL_BUDGET + 60. Tables: $OUT/gpu_check.md and .json, rewritten after every table.
#   receive  lists .ortgpu: ignored files stay on the machine between calls while it is warm, so the parts add up
#            there (all of .ortgpu in one call would exceed 64 MiB).
#   ort      installs onnxruntime-gpu from the parts, preload_dlls(), loads our library (the carried sm_90 build;
#            rebuilt there for sm_90 if it does not load), then: our ops through ONNX Runtime's CUDA provider
#            against the reference, against ONNX Runtime's LayerNorm/SkipLayerNorm/SimplifiedLayerNorm kernels
#            (CUDA graphs off and on; goal shapes first, until ORT_BUDGET seconds, default 75), and `onnx-norm
#            optimize` + `verify --provider cuda` of the bundled examples ($OUT/examples.tsv).
#   models   (after ort on the same machine: its install and library stay) builds the whole-model bench models
#            there (tools/device/make_gpu_models.py: LLaMA-like, hidden 4096, MLP 11008, and BERT-like, hidden
#            2048, MLP 8192, 2 layers each, fp16, random weights; ~0.7 and ~0.3 GB, so they cannot be carried),
#            then per model `onnx-norm optimize`, `verify --provider cuda` and `bench --provider cuda --sweep
#            sequence:512,2048` (IO binding always on there), and for GRAPH_MODELS (default llama-reciprocal
#            bert-decomposed) once more with `--cuda-graph` at the first sequence (ORT refuses the capture when
#            nodes stay on the CPU: said in skipped.txt, not a failure). The norm ORT does not fuse first
#            (llama-reciprocal, the >= 1.15x goal), then one it fuses (bert-decomposed, never slower), then
#            llama-div and bert-native; no model starts MODELS_DEADLINE seconds (default 150) after the stage began.
#            Reports under $OUT/models/; summary.md is rewritten after every model, so a killed call still brings
#            its tables back.
#
# Without a GPU (to check the invocations): GPU_DRY=1 PYTHON=.venv/bin/python OUT=/tmp/gpu-dry \
#   bash tools/device/run_gpu.sh ort models   runs the same commands on the CPU provider at tiny sizes, without
#   the install, the library copy and gpu_check (tests/kernels/test_gpu_models.py runs `models` this way).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DRY=${GPU_DRY:-0}
if [[ $DRY == 1 ]]; then
  PROVIDER=cpu
  GRAPH_MODELS="" # CUDA graphs need the CUDA provider
  # Tiny models, two short sequences, few rounds: seconds per model on a CPU.
  LLAMA_SIZES=(--hidden 64 --intermediate 128 --layers 1)
  BERT_SIZES=(--hidden 64 --intermediate 256 --layers 1)
  SEQUENCES=${SEQUENCES:-8,16}
  ROUNDS=(--warmup 1 --repeat 3 --sessions 1)
else
  PROVIDER=cuda
  LLAMA_SIZES=(--hidden "${LLAMA_HIDDEN:-4096}" --layers "${LAYERS:-2}")
  BERT_SIZES=(--hidden "${BERT_HIDDEN:-2048}" --intermediate "$((4 * ${BERT_HIDDEN:-2048}))" --layers "${LAYERS:-2}")
  SEQUENCES=${SEQUENCES:-512,2048}
  # Models benched a second time with CUDA graphs on (bench --cuda-graph); empty to skip.
  GRAPH_MODELS=${GRAPH_MODELS:-llama-reciprocal bert-decomposed}
  # One session per variant: building one of a 0.7 GB model takes seconds, and this stage has minutes.
  ROUNDS=(--warmup 5 --repeat 30 --sessions 1)
fi
# The stages' deadlines (the device-time plan above): seconds after which a table stops growing or no further
# model starts. gpu_check is killed 60 s after its budget.
KERNEL_BUDGET=${KERNEL_BUDGET:-170}
ORT_BUDGET=${ORT_BUDGET:-75}
MODELS_DEADLINE=${MODELS_DEADLINE:-150}

python_deps() {
  # Carried wheels, only for the modules the machine lacks (a carried onnx must not shadow the machine's).
  local wanted=(onnx:onnx ml_dtypes:ml_dtypes onnx_ir:onnx_ir rich:"rich markdown_it_py mdurl pygments")
  local module wheels stem
  for pair in "${wanted[@]}"; do
    module=${pair%%:*}
    "$PY" -c "import $module" 2>/dev/null && continue
    wheels=()
    for stem in ${pair#*:}; do
      wheels+=(.gpucarry/wheels/"$stem"-*.whl)
    done
    if ls "${wheels[@]}" >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --no-deps --target .gpucarry/site "${wheels[@]}"
    else
      echo "python module $module missing and no wheel for it in .gpucarry/wheels (run tools/device/prepare.sh)"
    fi
  done
  export PYTHONPATH=$PWD:$PWD/.gpucarry/site${PYTHONPATH:+:$PYTHONPATH}
}

environment() {
  {
    date -u
    if [[ $DRY == 1 ]]; then
      echo "dry run: CPU provider, tiny models ($(uname -m), $(nproc) CPUs)"
    else
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      nvcc --version | tail -n 2
      "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    fi
    "$PY" -c 'import onnx, onnxruntime as o; print("onnx", onnx.__version__, "onnxruntime", o.__version__, o.get_available_providers())'
    echo "onnx-norm $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
  } 2>&1 | tee "$OUT/environment.txt"
}

ort_runtime() {
  # onnxruntime-gpu from the carried parts (stage ort), or the one installed by an earlier stage on this machine.
  [[ $DRY == 1 ]] && return 0
  if [[ ! -d .ortgpu/site/onnxruntime ]]; then
    [[ -f .ortgpu/install.sh ]] || {
      echo "onnxruntime-gpu is not on this machine (a fresh one?): run the receive stages and ort first"
      return 1
    }
    bash .ortgpu/install.sh 2>&1 | tee "$OUT/ort-install.log"
    ((PIPESTATUS[0] == 0)) || return 1
  fi
  export PYTHONPATH=$PWD/.ortgpu/site:$PYTHONPATH
  "$PY" -c 'import onnxruntime as o; o.preload_dlls(); assert "CUDAExecutionProvider" in o.get_available_providers()' ||
    { echo "onnxruntime-gpu: no CUDA provider"; return 1; }
}

library() {
  # The carried library if it loads with the CUDA provider's runtime, else a build for sm_90 here.
  [[ $DRY == 1 ]] && return 0
  cp .gpucarry/libonnx_norm_ops.so onnx_norm/ 2>/dev/null
  if "$PY" -c 'import ctypes, onnx_norm.library as l; ctypes.CDLL(l.get_library_path())' 2>"$OUT/library.log"; then
    echo "custom-op library: loads ($("$PY" -c 'import onnx_norm.library as l; print(l.get_library_path())'))"
    return 0
  fi
  echo "custom-op library: carried build missing or not loadable ($(tail -n 1 "$OUT/library.log")); building for sm_90"
  if ! { cmake -S custom_ops -B build/gpu -DCMAKE_BUILD_TYPE=Release -DONNX_NORM_CUDA_ARCHITECTURES=90-real \
    -DONNX_NORM_ORT_INCLUDE_DIR="$PWD/.gpucarry/ort-include" >"$OUT/library-build.log" 2>&1 &&
    cmake --build build/gpu -j 16 >>"$OUT/library-build.log" 2>&1 &&
    cp "$(find build/gpu -name 'libonnx_norm_ops.so' | head -n 1)" onnx_norm/; }; then
    echo "library build failed: $OUT/library-build.log"
    return 1
  fi
}

# `onnx_norm SECONDS ARGS...`: the onnx-norm command from this checkout, killed after SECONDS; every call is
# logged with its command line in $OUT/commands.txt (the commands the summary's tables came from).
onnx_norm() {
  local seconds=$1
  shift
  echo "onnx-norm $*" >>"$OUT/commands.txt"
  timeout "$seconds" "$PY" -c 'import sys; from onnx_norm.cli import main; sys.exit(main(sys.argv[1:]))' "$@"
}

examples() {
  local model name fused status=0
  mkdir -p build/examples
  for model in examples/*.onnx; do
    name=$(basename "$model" .onnx)
    fused=build/examples/$name.fused.onnx
    if onnx_norm 120 optimize "$model" -o "$fused" >>"$OUT/examples.log" 2>&1 &&
      onnx_norm 120 verify "$model" "$fused" --provider "$PROVIDER" >>"$OUT/examples.log" 2>&1; then
      printf '%s\tpassed\n' "$name" >>"$OUT/examples.tsv"
    else
      printf '%s\tFAILED\n' "$name" >>"$OUT/examples.tsv"
      echo "FAIL $name (see examples.log)"
      status=1
    fi
  done
  return $status
}

whole_models() {
  # Builds the models here (see make_gpu_models.py), then optimize, verify and bench each; reports in $OUT/models.
  local dir=build/gpu-models reports=$OUT/models status=0 name model fused extra rc began=$SECONDS
  mkdir -p "$dir" "$reports"
  local llama=(tools/device/make_gpu_models.py --out "$dir/llama" --models llama-div llama-reciprocal "${LLAMA_SIZES[@]}")
  local bert=(tools/device/make_gpu_models.py --out "$dir/bert" --models bert-decomposed bert-native "${BERT_SIZES[@]}")
  printf 'python %s\n' "${llama[*]}" "${bert[*]}" >>"$OUT/commands.txt"
  "$PY" "${llama[@]}" && "$PY" "${bert[@]}" || return 1
  "$PY" -c 'import json, sys; print(json.dumps({**json.load(open(sys.argv[1])), **json.load(open(sys.argv[2]))}))' \
    "$dir/llama/models.json" "$dir/bert/models.json" >"$reports/models.json"
  # The unfused norm first (the speedup goal), then one ORT fuses (never slower), then the other two.
  for name in llama-reciprocal bert-decomposed llama-div bert-native; do
    if ((SECONDS - began > MODELS_DEADLINE)); then
      echo "$name: skipped, the stage is past ${MODELS_DEADLINE}s" | tee -a "$reports/skipped.txt"
      continue
    fi
    model=$(ls "$dir"/*/"$name.onnx")
    fused=$dir/$name.fused.onnx
    extra=()
    [[ $name == bert-native ]] && extra=(--take-over-native) # ORT's own op: ours only when asked to replace it
    echo "== $name ($((SECONDS - began))s into the stage)"
    onnx_norm 180 optimize "$model" -o "$fused" --report "$reports/$name.optimize.json" "${extra[@]}" ||
      { echo "FAIL optimize $name"; status=1; continue; }
    # No float64 golden: its upcast copy of a 0.7 GB fp16 model exceeds protobuf's 2 GB, and the fallback
    # (onnx's ReferenceEvaluator) takes minutes. The gate still compares every output and fused norm.
    onnx_norm 180 verify "$model" "$fused" --provider "$PROVIDER" --shape "sequence:${SEQUENCES%%,*}" --golden none \
      --report "$reports/$name.verify.json" || { echo "FAIL verify $name"; status=1; }
    onnx_norm 240 bench "$model" "$fused" --provider "$PROVIDER" --sweep "sequence:$SEQUENCES" "${ROUNDS[@]}" \
      --report "$reports/$name.bench.json" || { echo "FAIL bench $name"; status=1; }
    if [[ $PROVIDER == cuda && " $GRAPH_MODELS " == *" $name "* ]]; then
      # The same pair under CUDA graphs, at the first sequence (a graph replays the shapes it captured). Exit 2
      # is ORT refusing the capture (nodes left on the CPU): reported, not a failure of ours.
      onnx_norm 180 bench "$model" "$fused" --provider cuda --cuda-graph --shape "sequence:${SEQUENCES%%,*}" \
        "${ROUNDS[@]}" --no-noopt --report "$reports/$name.bench-graph.json"
      rc=$?
      ((rc == 2)) && echo "$name: CUDA graphs not measured (bench exit 2, reason in models.log)" | tee -a "$reports/skipped.txt"
      ((rc == 1)) && { echo "FAIL bench --cuda-graph $name"; status=1; }
    fi
    summary >/dev/null # after every model: a run killed at the call's limit still brings its tables back
  done > >(tee -a "$OUT/models.log") 2>&1 # not a pipe: the loop must set this shell's status
  return $status
}

summary() {
  "$PY" tools/device/summarize.py "$OUT"
}

kernels_stage() {
  python_deps
  environment
  # Every op, the adaLN ops included, through gpu_check's one harness build and LaunchNorm.
  timeout "$((KERNEL_BUDGET + 60))" "$PY" tools/gpu_check.py --no-ort --budget "$KERNEL_BUDGET" --out "$OUT" \
    --build-dir .gpucarry/harness 2>&1 |
    tee "$OUT/kernels.log"
  return "${PIPESTATUS[0]}"
}

ort_stage() {
  local status=0
  python_deps
  ort_runtime || return 1
  environment
  library || return 1
  if [[ $DRY != 1 ]]; then
    timeout "$((ORT_BUDGET + 60))" "$PY" tools/gpu_check.py --ort-only --budget "$ORT_BUDGET" --out "$OUT" 2>&1 |
      tee "$OUT/ort.log"
    ((PIPESTATUS[0] == 0)) || status=1
  fi
  examples || status=1
  summary || status=1
  return $status
}

models_stage() {
  local status=0
  python_deps
  ort_runtime || return 1
  [[ -s $OUT/environment.txt ]] || environment
  library || return 1
  whole_models || status=1
  summary || status=1
  return $status
}

# The stages named, in order (default: kernels); every one runs, the call's status is the worst of theirs.
stages=("$@")
((${#stages[@]})) || stages=(kernels)
for stage in "${stages[@]}"; do
  [[ $stage =~ ^(kernels|receive|ort|models)$ ]] || { echo "usage: $0 [kernels|receive|ort|models]..." >&2; exit 2; }
done
status=0
for stage in "${stages[@]}"; do
  echo "== stage $stage ($(date -u +%T))"
  case $stage in
    kernels) kernels_stage || status=1 ;;
    receive) ls -la .ortgpu/ ;;
    ort) ort_stage || status=1 ;;
    models) models_stage || status=1 ;;
  esac
done
exit $status
