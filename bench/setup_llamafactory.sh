#!/usr/bin/env bash
# Creates bench/.venv-lf with LLaMA-Factory 0.9.5 (the workflow peer), following ../shared/PEERS.md:
# torch pinned first (local CPU wheel), LLaMA-Factory without deps, then its pins by hand, and a
# stand-in torchaudio (no CPU build here; LLaMA-Factory imports it at module level but our jobs never use it).
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv-lf
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q --no-deps llamafactory==0.9.5
"$PY" -m pip install -q "transformers<=5.6.0,>=4.49" "peft<=0.18.1" "trl<=0.24.0" "datasets<=4.0.0" "accelerate<=1.11.0" \
    tokenizers safetensors sentencepiece tiktoken fastapi uvicorn sse-starlette fire omegaconf "tyro<0.9" matplotlib \
    pydantic packaging pyyaml numpy scipy einops protobuf av librosa jieba nltk rouge-chinese modelscope 2>/dev/null \
  || "$PY" -m pip install -q "transformers<=5.6.0,>=4.49" "peft<=0.18.1" "trl<=0.24.0" "datasets<=4.0.0" "accelerate<=1.11.0" \
    tokenizers safetensors sentencepiece fastapi uvicorn sse-starlette fire omegaconf "tyro<0.9" matplotlib pydantic packaging pyyaml numpy scipy einops protobuf
# The Pillow of the environment lathe's tests run in: Pillow versions resample images differently, and the
# multimodal goldens (tests/llm/golden/make_llamafactory_qwen2vl.py) compare pixel values exactly.
PILLOW=$(python -c "import PIL; print(PIL.__version__)" 2>/dev/null || true)
[ -z "$PILLOW" ] || "$PY" -m pip install -q "pillow==$PILLOW"
STUB="$PWD/lf_stubs/torchaudio"
mkdir -p "$STUB"
cat > "$STUB/__init__.py" <<'PY'
"""Stand-in torchaudio for the LLaMA-Factory peer only: its multimodal plugin imports torchaudio at
module level, and there is no CPU build here. Any real use raises."""
def __getattr__(name):
    raise ImportError("torchaudio is a stand-in in this benchmark environment")
PY
echo "LLaMA-Factory peer ready: PYTHONPATH=$PWD/lf_stubs $PWD/$VENV/bin/llamafactory-cli"
