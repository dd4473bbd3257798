#!/usr/bin/env bash
# Creates bench/.venv-peers: the one interpreter every runner (plain, transformers, lathe) uses,
# so all three see the same torch build and the same transformers (lathe only borrows its model
# classes and tokenizer for the lm job). lathe itself is put on PYTHONPATH by run_all.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-peers"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# torch first and pinned: the pin matches the local CPU wheel; an unpinned torch pulls several GB of CUDA.
"$venv/bin/pip" install --quiet "torch==2.13.0"
"$venv/bin/pip" install --quiet "transformers==5.23.0" "accelerate==1.15.0" safetensors tokenizers \
    numpy pyyaml tqdm psutil
# transformers' own Trainer tests (bench/hf_trainer_tests.py) need these to import and run.
"$venv/bin/pip" install --quiet pytest pytest-timeout parameterized datasets
"$venv/bin/python" - <<'PY'
import torch, transformers, accelerate, tokenizers, safetensors
print("torch", torch.__version__, "| transformers", transformers.__version__,
      "| accelerate", accelerate.__version__, "| tokenizers", tokenizers.__version__,
      "| safetensors", safetensors.__version__)
PY
