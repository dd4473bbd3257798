#!/usr/bin/env bash
# The lower end of lathe's torch range on the CPU: a venv under bench/.cache/ with torch==$TORCH (default 2.11.0, the
# device image's torch) and this machine's transformers, then a core subset of lathe's tests (the loop, exact
# resume, the chunked loss, a transformers comparison). Writes bench/.cache/torch-floor-$TORCH.log; docs/TORCH_VERSIONS.md
# records the outcome. PyPI's torch wheels for linux are CUDA builds: torch 2.11.0 is 531 MB and pulls ~3 GB of
# nvidia-* libraries (no CPU-only 2.11 wheel is on PyPI, and download.pytorch.org is not reachable here).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH:-2.11.0}
TRANSFORMERS=${TRANSFORMERS:-$(python3 -c 'import transformers; print(transformers.__version__)')}
VENV=bench/.cache/torch-floor-$TORCH
LOG=bench/.cache/torch-floor-$TORCH.log
mkdir -p bench/.cache
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "torch==$TORCH" "transformers==$TRANSFORMERS" accelerate peft numpy safetensors \
        pyyaml tqdm pytest hypothesis
fi
TESTS=(tests/train/test_trainer_steps.py tests/train/test_resume.py tests/train/test_chunked_loss.py
    tests/train/test_trainer_loop_compat.py)
{
    "$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}" 2>&1
} | tee "$LOG"
exit "${PIPESTATUS[0]}"
