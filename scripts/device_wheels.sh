#!/usr/bin/env bash
# The reference libraries that the H200 image lacks, as wheels for its Python (3.12), into .whl/ (ignored by git):
#
#   here, before the device call:  bash scripts/device_wheels.sh       (needs PyPI; about 0.5 MB)
#   the device call:               run(command="bash scripts/gpu_window.sh", carry=[".whl"])
#
# scripts/gpu_window.sh installs whatever .whl/ holds into a folder of its own ($SITE) and puts it on
# PYTHONPATH, so that the CUDA cost table also has its x-transformers section (xt) and rotary-embedding-torch's
# row in the RoPE table. Without the wheels the bench skips both by name and keeps the rest.
# The versions are those the tests here check against (requirements.txt resolves them); every one is pure
# Python. torch, numpy, sympy and packaging are in the image (device KINDS.md) and are not carried.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    rotary-embedding-torch==0.9.1 x-transformers==2.31.10 einx==0.4.3 loguru==0.7.3 torch-einops-utils==0.2.0 \
    frozendict==2.5.1 einops==0.8.2
ls .whl
