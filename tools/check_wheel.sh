#!/usr/bin/env bash
# What a user of the wheel does, checked: install it into a fresh virtual environment with no compiler on PATH
# (binary packages only, so nothing can be built), then run `onnx-norm demo` and tools/wheel_smoke.py (the
# library registers with ONNX Runtime and its ops match the reference) from outside the repository, without torch.
#   bash tools/check_wheel.sh OUTDIR/onnx_norm-*.whl
# .ci/run runs it on the wheel it builds. Prints the time the install took.
set -euo pipefail

wheel=$(realpath "${1:?usage: bash tools/check_wheel.sh WHEEL}")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=$(command -v "${PYTHON:-python3}")
# A realpath of the interpreter: pyenv's shims and the like need PATH to find the real one.
python=$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "fresh venv, pip install $(basename "$wheel") (PATH: the venv only)"
"$python" -m venv "$work/venv"
start=$(date +%s)
# env -i: no compiler on PATH, no CC/CXX, nothing of the caller's venv; pip keeps its configuration (index,
# certificates, proxies, cache).
clean=(env -i HOME="$HOME" PATH="$work/venv/bin" PIP_DISABLE_PIP_VERSION_CHECK=1)
while IFS= read -r var; do
  clean+=("$var=${!var}")
done < <(compgen -e | grep -E '^(PIP_|https?_proxy$|HTTPS?_PROXY$|no_proxy$|NO_PROXY$|SSL_CERT_|REQUESTS_CA_BUNDLE$)' || true)
if "${clean[@]}" /bin/sh -c 'command -v cc || command -v gcc || command -v g++ || command -v nvcc'; then
  echo "a compiler is on the clean PATH" >&2
  exit 1
fi
"${clean[@]}" "$work/venv/bin/python" -m pip install -q --only-binary=:all: "$wheel"
echo "installed in $(($(date +%s) - start)) s"

cd "$work"
step "onnx-norm demo (from $work)"
"${clean[@]}" "$work/venv/bin/onnx-norm" demo --out "$work/demo"

step "smoke test: the installed library registered with ONNX Runtime"
"${clean[@]}" "$work/venv/bin/python" "$root/tools/wheel_smoke.py"
