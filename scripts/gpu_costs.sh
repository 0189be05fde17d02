#!/usr/bin/env bash
# The CUDA cost table, for the time a GPU window has left after scripts/gpu_window.sh:
#
#   device run:  bash scripts/gpu_costs.sh              (a few minutes on an H200)
#   back here:   cp <files_at>/cuda.json results/bench/cuda.json && git add results/bench && git commit
#
# Sections gpu (every scheme at d=512 and seq 1024/4096 in bf16; RoPE at LLaMA's shapes; ALiBi and T5
# through FlexAttention against the [H, n, n] bias at 4096/16384) and schemes/xt at the CPU table's
# sizes, saved as one JSON file (`posenc.bench.stored` reads it). The comparison chapter shows the gpu
# section ("On a GPU"); the findings page takes its cost column from the schemes section under the
# `full` profile. The H200 image has neither x-transformers nor rotary-embedding-torch: the bench then
# skips xt and the RoPE table's rotary-embedding-torch row, each by name, and keeps the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/posenc-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout "${LIMIT:-420}" python3 -m posenc.bench --device cuda --only gpu schemes xt --save "$OUT/cuda.json" 2>&1 \
    | tee "$OUT/bench.log"
ls -la "$OUT"
