#!/usr/bin/env bash
# The CUDA cost table, for the time a GPU window has left after scripts/gpu_window.sh:
#
#   device run:  bash scripts/gpu_costs.sh              (a few minutes on an H200)
#   back here:   cp <files_at>/cuda.json results/bench/cuda.json && git add results/bench && git commit
#
# Sections schemes/xt at the CPU table's sizes, then gpu (RoPE at LLaMA's shapes; ALiBi and T5 through
# FlexAttention against the [H, n, n] bias at 4096/16384; every scheme at d=512 and seq 1024/4096 in bf16,
# a scheme that runs out of memory or past 3 s a step left out by name), saved as one JSON file
# (`posenc.bench.stored` reads it) after each section and each of gpu's three tables, so a window cut
# short keeps what it finished. The comparison chapter shows the gpu
# section ("On a GPU"); the findings page takes its cost column from the schemes section under the
# `full` profile. The H200 image has neither x-transformers nor rotary-embedding-torch: the bench then
# skips xt and the RoPE table's rotary-embedding-torch row, each by name, and keeps the rest.
# With LIMIT >= 330 s, the last 180 s test and time the training step replayed as a CUDA graph
# (tests/test_graphed.py's CUDA tests, then `python -m posenc.bench --only graphs`: graphs.log, graphs.json):
# the runner trains eagerly until such a window shows that graphs pay with ten workers (`graph_decision`).
# `SECTIONS= LIMIT=200 bash scripts/gpu_costs.sh` runs that probe alone (a second call, once cuda.json is back).
#   back here:   cp <files_at>/graphs.json results/bench/graphs.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/posenc-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LIMIT=${LIMIT:-420}
SECTIONS=${SECTIONS-schemes press xt gpu}             # quickest first, each saved when done; SECTIONS= : the graph probe alone
if [ -z "$SECTIONS" ]; then GRAPHS=$LIMIT          # the last 180 s go to the CUDA-graph probe, when there are 330
elif [ "$LIMIT" -ge 330 ]; then GRAPHS=180; else GRAPHS=0; fi
# The stored table is the starting point: the bench keeps what this call does not make again (same machine line).
[ -f results/bench/cuda.json ] && [ ! -f "$OUT/cuda.json" ] && cp results/bench/cuda.json "$OUT/cuda.json"
[ -z "$SECTIONS" ] || timeout $(( LIMIT - GRAPHS )) python3 -m posenc.bench --device cuda --only $SECTIONS \
    --save "$OUT/cuda.json" 2>&1 | tee "$OUT/bench.log"
if [ "$GRAPHS" -gt 0 ]; then                     # the step replayed as a CUDA graph: correct here? faster here?
    timeout 45 python3 -m pytest -q -c /dev/null -p no:cacheprovider tests/test_graphed.py 2>&1 | tail -5 \
        | tee "$OUT/graphs.log"
    timeout $(( GRAPHS - 50 )) python3 -m posenc.bench --device cuda --only graphs --save "$OUT/graphs.json" 2>&1 \
        | tee -a "$OUT/graphs.log"
fi
ls -la "$OUT"
