#!/usr/bin/env bash
# The one device call's command (bench/gpu/run.py's docstring): install the carried wheels, if any, beside the
# device's own packages, then run the GPU bench with the repository on PYTHONPATH; its reports land in $OUT.
set -u
cd "$(dirname "$0")/../.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 bench/gpu/run.py "$@" 2>&1 | tee "${OUT:-bench/gpu/out}/run.log"
exit "${PIPESTATUS[0]}"
