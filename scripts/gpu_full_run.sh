#!/bin/bash
# Run the `full` profile of some chapters in parallel on one GPU machine, without Jupyter.
#
#   bash scripts/gpu_full_run.sh 08 09 10          # chapters by number; BUDGET=540 seconds by default
#   BENCH=1 bash scripts/gpu_full_run.sh 11        # first the CUDA cost table (results/15_bench_cuda.json)
#
# Each chapter runs as its own process (scripts/run_as_script.py) and writes results/ as its
# notebook would; logs go to logs/NN.log. Every process is stopped at the budget, so a call
# with a hard time limit still returns what finished. Small models are launch-bound: several
# processes share one GPU well (on an H200, five chapters at once ran at 50-100 steps/s each).
set -u
T0=$(date +%s); END=$((T0 + ${BUDGET:-540}))
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MPLBACKEND=Agg PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
mkdir -p logs results
if [ "${BENCH:-0}" = 1 ]; then
  timeout 150 python3 -m posenc.bench --only schemes xt memory --device cuda --rounds 10 \
    --save results/15_bench_cuda.json > logs/bench.log 2>&1
  echo "bench rc=$? at $(( $(date +%s) - T0 )) s"
fi
LEFT=$((END - $(date +%s)))
for nb in "$@"; do
  ( timeout $LEFT python3 scripts/run_as_script.py notebooks/${nb}_*.ipynb --profile full > logs/$nb.log 2>&1
    echo "$nb rc=$? at $(( $(date +%s) - T0 )) s" | tee -a logs/$nb.log ) &
done
wait
