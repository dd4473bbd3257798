#!/usr/bin/env bash
# Fetch the wheels bench/gpu's device call carries (bench/gpu/WHEELS.md) into .whl/ at the repository root, for the
# device's python 3.12 on manylinux x86-64, whatever this machine runs. .whl/ is git-ignored (.gitignore and
# .git/info/exclude), so it travels only when the call names it in `carry`. Everything else the bench needs is
# already on the device (torch 2.11, transformers, peft, accelerate, triton).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null ||
    echo '/.whl/' >>"$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p .whl
# Liger-Kernel (the use_liger_kernel runs, pure python on the device's triton) and bitsandbytes (the QLoRA test;
# its wheel holds a libbitsandbytes for each CUDA, cuda130 among them).
WHEELS=("liger-kernel==0.8.5" "bitsandbytes==0.50.2")
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${WHEELS[@]}"
ls -l .whl
total=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "carry: $((total / 1048576)) MiB of wheels (64 MiB per call with the working tree)"
