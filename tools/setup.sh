#!/usr/bin/env bash
# Sets up onnx-norm on a fresh Debian/Ubuntu machine, from the repository root: the system packages the
# build needs, a virtual environment (.venv, or $ONNX_NORM_VENV), torch pinned to a CPU build, and the
# project (editable, with its test extras), whose install builds the custom-op library (CUDA kernels too
# when nvcc is on PATH; ONNX_NORM_ENABLE_CUDA=OFF skips them). Safe to run again: it reuses the venv and the
# build directory (build/<wheel tag>), so a second run recompiles only what changed.
#
# CUDA architectures (ONNX_NORM_CUDA_ARCHITECTURES overrides): the GPU of this machine (`native`) when
# nvidia-smi sees one, otherwise sm_90 only, what CI's checks read (the library builds with CUDA and ptxas's
# spill report covers sm_90; tests/kernels/test_cuda_build.py compiles sm_80 and sm_90 itself). The release list
# (Ampere to Blackwell) is tools/build_wheel.sh's job.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
PYTHON=${PYTHON:-python3}
VENV=${ONNX_NORM_VENV:-.venv}
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0 # the release built against torch $TORCH_VERSION (timm needs it)
TIMM_VERSION=1.0.31
TIMM_SITE=build/timm-site
SILERO_VERSION=6.2.3
RAPIDOCR_VERSION=1.4.4
PUBLIC_MODELS=build/public-models
OPENVINO_VERSION=2026.4.1
OPENVINO_SITE=build/openvino-site

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "system packages"
# A C++17 compiler and venv support are required; cmake and ninja come from PyPI through the build backend
# when the system has none. dpkg-deb and the Debian archive keyring let the build fetch the ONNX Runtime
# headers (Debian's libonnxruntime-dev) when ONNX_NORM_ORT_INCLUDE_DIR is not given.
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if command -v apt-get >/dev/null; then
  command -v dpkg-deb >/dev/null || missing+=(dpkg)
  [[ -e /usr/share/keyrings/debian-archive-keyring.gpg ]] || missing+=(debian-archive-keyring)
fi
if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null; then
    echo "missing: ${missing[*]}; install them with the system's package manager" >&2
    exit 1
  fi
  sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "all present: g++ $(g++ -dumpversion), $(cmake --version | head -n1), ninja $(ninja --version)"
fi

step "virtual environment $VENV"
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install -q --upgrade pip

step "torch $TORCH_VERSION"
# Pinned and installed before the project: a bare torch requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==$TORCH_VERSION"

if [[ -z ${ONNX_NORM_CUDA_ARCHITECTURES:-} ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    ONNX_NORM_CUDA_ARCHITECTURES=native
  else
    ONNX_NORM_CUDA_ARCHITECTURES=90-real
  fi
fi
export ONNX_NORM_CUDA_ARCHITECTURES
mkdir -p build
# .ci/run builds its wheel in the same build directory with the same list, so that nothing recompiles.
echo "$ONNX_NORM_CUDA_ARCHITECTURES" >build/cuda_architectures

step "onnx-norm (editable, with test extras; CUDA architectures $ONNX_NORM_CUDA_ARCHITECTURES)"
# Without build isolation: scikit-build-core clears the build directory's CMake cache and objects whenever
# its own path changes, which pip's temporary build environments do on every install. So the venv holds
# the build backend, and what it asks for (cmake or ninja from PyPI only when the system's are missing or
# too old).
python -m pip install -q 'scikit-build-core>=0.10'
mapfile -t requires < <(python -c 'from scikit_build_core.build import get_requires_for_build_editable as r; [print(x) for x in r()]')
((${#requires[@]} == 0)) || python -m pip install -q "${requires[@]}"
# Verbose, into a log: the CMake decisions and ptxas's per-kernel register/spill report are in it.
mkdir -p build
log=build/install.log
if ! python -m pip install --no-build-isolation -v -e '.[test]' >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "pip install failed; full log: $log" >&2
  exit 1
fi
grep -E -- '-- onnx-norm:' "$log" || true

step "integrations: onnxruntime-genai, olive-ai (tests/test_integrations_*.py; ~1 min)"
# Optional: their tests skip when these are missing. The constraints keep pip from replacing what is installed
# (torch, onnxruntime-gpu, onnx, transformers, ...). onnxruntime-genai goes in with --no-deps: it requires the
# `onnxruntime` distribution, which would install beside onnxruntime-gpu and break both (they share the
# `onnxruntime` package directory); it loads whichever one provides `onnxruntime`. olive-ai 0.13 imports
# requests without declaring it.
python -m pip freeze | grep -E '^(torch|onnx|onnxruntime-gpu|onnxruntime|onnxscript|onnx-ir|numpy|transformers)==' >build/constraints.txt || true
python -m pip install -q --no-deps "onnxruntime-genai>=0.18" || echo "onnxruntime-genai not installed; its tests skip"
python -m pip install -q -c build/constraints.txt "olive-ai>=0.13" requests || echo "olive-ai not installed; its tests skip"

step "timm $TIMM_VERSION and torchvision $TORCHVISION_VERSION into $TIMM_SITE (tests/rewrite/test_group_norm_timm.py; ~5 s)"
# Not into the venv: torchvision's PyPI wheel is built for CUDA torch, and beside the CPU torch its C ops do not load
# and its import fails; transformers imports torchvision whenever it can find it, so every transformers test would
# fail. Only the timm exports put this folder on their path (onnx_norm/zoo/compat.py lets torchvision import there
# without its C ops). --no-deps: what the two need besides (torch, pillow, PyYAML, huggingface_hub, safetensors) is
# the venv's, and pip would otherwise put a second torch into the folder.
if [[ ! -d $TIMM_SITE/timm-$TIMM_VERSION.dist-info || ! -d $TIMM_SITE/torchvision-$TORCHVISION_VERSION.dist-info ]]; then
  rm -rf "$TIMM_SITE"
  python -m pip install -q --no-deps --target "$TIMM_SITE" "timm==$TIMM_VERSION" "torchvision==$TORCHVISION_VERSION" ||
    echo "timm not installed; its tests skip"
fi
python -c 'import onnx_norm.library as lib; print("custom-op library:", lib.get_library_path())'

step "model files other people made, from public packages, into $PUBLIC_MODELS (tests/parity/test_public_models.py; ~3 s)"
# The parity gate is judged on files it did not make: Silero VAD (a scalar sample rate compared inside an If, a
# state input whose batch dim is unnamed) and RapidOCR's PaddleOCR models (a batch dim stored as -1, Paddle's
# LayerNorm spelling). Only the .onnx files are kept; the packages are never installed (their dependencies would
# pull opencv and a second onnxruntime).
if [[ ! -f $PUBLIC_MODELS/.complete ]]; then
  rm -rf "$PUBLIC_MODELS" && mkdir -p "$PUBLIC_MODELS/wheels"
  if python -m pip download -q --no-deps -d "$PUBLIC_MODELS/wheels" "silero-vad==$SILERO_VERSION" \
    "rapidocr-onnxruntime==$RAPIDOCR_VERSION"; then
    python - "$PUBLIC_MODELS" <<'PY'
import sys, zipfile
from pathlib import Path
root = Path(sys.argv[1])
for wheel in (root / "wheels").glob("*.whl"):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".onnx"):
                (root / Path(name).name).write_bytes(archive.read(name))
PY
    rm -rf "$PUBLIC_MODELS/wheels" && touch "$PUBLIC_MODELS/.complete"
  else
    echo "public model files not fetched; their tests skip"
  fi
fi

step "openvino $OPENVINO_VERSION into $OPENVINO_SITE (tests/integrations/test_runtime_check.py, tools/runtime_check.py; ~10 s)"
# Optional, like timm: its tests skip without it. Not into the venv: openvino pins numpy below the next major and
# pulls its telemetry package; only tools/runtime_check.py puts this folder on its path. --no-deps: numpy is the
# venv's (openvino-telemetry is only for its converters).
if [[ ! -d $OPENVINO_SITE/openvino-$OPENVINO_VERSION.dist-info ]]; then
  rm -rf "$OPENVINO_SITE"
  python -m pip install -q --no-deps --target "$OPENVINO_SITE" "openvino==$OPENVINO_VERSION" ||
    echo "openvino not installed; its tests skip"
fi

step "onnxruntime-web and onnxruntime-node into tools/web/node_modules (tests/integrations/test_runtime_check.py; ~20 s)"
# Optional: the web tests skip without node or these. Pinned by tools/web/package-lock.json; --ignore-scripts:
# onnxruntime-node's install script would fetch CUDA binaries from GitHub, and its CPU binaries are in the package.
if ! command -v npm >/dev/null; then
  echo "npm not found; the web tests skip (Node 20 or newer with npm runs them)"
elif [[ tools/web/node_modules/.package-lock.json -nt tools/web/package-lock.json ]]; then
  echo "already installed"
else
  (cd tools/web && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) ||
    echo "tools/web packages not installed; the web tests skip"
fi

if grep -a -q -- '-- onnx-norm: building CUDA kernels' "$log"; then
  step "CUDA kernels: register spills"
  bash tools/check_spills.sh "$log"
  # tests/kernels/test_cuda_build.py reads the kernels' SASS with nvdisasm, from the sm_90 cubins that cuobjdump extracts
  # from this build's objects (compiling them again would cost ~60 CPU-s); nvcc-only toolkits lack both (small
  # wheels, seconds).
  for tool in nvdisasm cuobjdump; do
    if ! command -v "$tool" >/dev/null && [[ ! -x "$(dirname "$(command -v nvcc)")/$tool" ]]; then
      python -m pip install -q "nvidia-cuda-$tool"
    fi
  done
fi
