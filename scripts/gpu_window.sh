#!/usr/bin/env bash
# The prepared job for a lent GPU window (see the README, "Runs as data"):
#
#   device run:  bash scripts/gpu_window.sh            (DEADLINE=480 WORKERS=10 by default)
#   back here:   tar xzf <files_at>/full_store.tgz && git add results/full && git commit
#   time left:   bash scripts/gpu_costs.sh            (the CUDA cost table, results/bench/cuda.json)
#
# First a 20-second probe (`python -m posenc.bench --only stacking`): three seeds trained one by one
# against the same three as one stacked model (torch.func.vmap). The runner then stacks seeds
# (--stack-seeds) only if that measured faster here, by 1.2x or more, with the same final losses
# (within 2%: bf16 rounding); STACK=1 or STACK=0 skips the probe and decides. The runner takes
# the missing `full` runs of every chapter in priority order, stores each the moment it ends, and
# stops cleanly at the deadline (a run in flight is abandoned and the next window resumes it). The store comes back through $OUT as one archive, with the
# runner's log, the probe, and the dry-run before and after.
# Budget of one device call (600 s): probe <= 45 s, runner 480 s, then about 20 s to list, refit
# and pack the store. Keep DEADLINE so that the whole script ends before the call's limit: the
# archive is made last, and a call cut off before it brings nothing back.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/posenc-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import posenc, torch; print('posenc', posenc.__version__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
python3 -m posenc.runs --profile full --dry-run --stack-seeds > "$OUT/dry_run_before.txt" 2>&1
if [ -z "${STACK:-}" ]; then
    timeout 45 python3 -m posenc.bench --only stacking --rounds 3 --save "$OUT/stacking.json" 2>&1 | tee "$OUT/stacking.log"
    STACK=$(python3 -c "
import json, statistics, sys
try:
    rows = json.load(open('$OUT/stacking.json'))['sections']['stacking']['rows']
    print(int(statistics.median(r['speedup'] for r in rows) >= 1.2 and max(r['loss_gap'] for r in rows) < 0.02))
except Exception as err:
    print(0); print('no stacking probe:', err, file=sys.stderr)")
fi
echo "stack seeds: $STACK" | tee -a "$OUT/stacking.log"
FLAGS=$([ "$STACK" = 1 ] && echo --stack-seeds)
python3 -m posenc.runs --profile full --deadline "${DEADLINE:-480}" --workers "${WORKERS:-10}" $FLAGS 2>&1 | tee "$OUT/runner.log"
python3 -m posenc.runs --profile full --dry-run > "$OUT/dry_run_after.txt" 2>&1
python3 -m posenc.runs --profile full --fit 2>&1 | tee "$OUT/cost_fit.txt"   # the cost model refitted to this window
tar czf "$OUT/full_store.tgz" results/full
ls -la "$OUT"
