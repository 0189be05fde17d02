#!/usr/bin/env bash
# The prepared job for a lent GPU window (see the README, "Runs as data"):
#
#   before:      bash scripts/device_wheels.sh          (here: x-transformers and rotary-embedding-torch as wheels in .whl/)
#                bash scripts/device_tree.sh aside      (the store's weights set aside: the tree that travels must stay
#                                                        under 64 MiB, and the runner reads records, not weights)
#   call 1:      bash scripts/gpu_window.sh             (timeout_s 600, carry [".whl"]; the deadline is at most 400 s)
#   back here:   bash scripts/device_unpack.sh <files_at>  (the runs this call finished, in parts of under 16 MiB,
#                                                        or in interim.tgz if the call was cut short,
#                                                        unpacked; their weights set aside, or call 2 is refused
#                                                        for a tree over 64 MiB; cuda.json copied if it came)
#   call 2, at once (a machine left idle 30 s is given back), if `full` is not done and at least 3 minutes
#   of the session's device time are left (status: budget_left_s), with timeout_s = that time - 20 (under
#   3 minutes the deadline left after packing is under 20 s, and the runner is not started):
#                STACK=<call 1's> WORKERS=<call 1's> BUDGET=<timeout_s - 30> bash scripts/gpu_window.sh   (carry [".whl"])
#                (the runner's deadline follows from BUDGET: what the probes left, less 60 s to pack)
#                Unpack call 1's parts first: each call replaces the machine's store with this tree's.
#   at the end:  bash scripts/device_tree.sh back && git add results/full && git commit
#
# First a 30-second probe (`python -m posenc.bench --only stacking`): three seeds trained one by one
# against the same three as one stacked model (torch.func.vmap). The runner then stacks seeds
# (--stack-seeds) only if that measured faster here, by 1.2x or more, with the same final losses
# (within 2%: bf16 rounding); STACK=1 or STACK=0 skips the probe and decides.
# Then the worker probe (`python -m posenc.bench --only workers`, about 70 s): the aggregate training steps per
# second of 1, 6, 10 and 16 processes sharing the GPU, each stepping the tier's usual model; the runner takes the
# fewest workers within 5% of the best rate. The 2026-12-04 window ran 10 and measured 178.6 steps/s in all, while
# one process alone stepped the same size of model 85 times a second. WORKERS=<n> skips the probe.
# The runner takes the missing `full` runs of every chapter in priority order, the runs that need a quarter of
# the deadline or more first (longest first), stores each the moment it ends, starts none that its cost model
# says would end after the deadline, and stops cleanly there (a run in flight is abandoned and the next window
# starts it again). WORKERS=10 skips the worker probe (70 s); the 2026-12-04 windows all ran 10 set by hand, so the probe
# has yet to run on a GPU: a window with a long tier left should let it (PROBES=always, where the dry run would
# skip it), and its answer then holds for the rest. The stacking probe
# (60 s) times NoPE, RoPE and ALiBi: in the third 2026-12-04 window it timed NoPE and RoPE alone (1.24x, same
# losses), and every stacked group with a mask or both directions then failed in the runner (a softmax backward
# with two dtypes under SDPA's math kernel; those now take posenc.attention's explicit path) and fell back to
# training seed by seed. ALiBi's row puts that path in the probe: if it fails, nothing is stacked.
# What comes back through $OUT: the runs finished in this call (the store's new files, each run's weights
# before its record) as one archive split into parts of PART bytes (scripts/pack_new.sh: the device tool
# brings back files of at most 16 MiB, 8 files, 64 MiB in all), the runner's log with the probe's table, and the
# dry-run before and after with the cost model refitted to this window (dry_run.txt).
# If the whole tier is done before the deadline, the time left to the call's budget goes to the
# CUDA cost table (scripts/gpu_costs.sh: cuda.json, bench.log), after the store is packed.
# Budget of one device call (600 s): probes <= 160 s (skipped where they cannot pay), runner at most 400 s (and
# killed 45 s past its deadline if it has not stopped), then the store is packed at once, and only then listed
# and refitted (BUDGET, 570 s, bounds the deadline and the optional cost table). While the runner runs, the
# runs it finished are re-packed every minute into interim.tgz, which the final pack replaces: a call killed at
# its time limit still brings back all but the last minute's runs. The script exits with the runner's status.
# Rehearsal without a GPU (tests/test_gpu_window.py runs it in a throwaway copy of the repository):
#   DEVICE=cpu CHAPTERS=01_learned STACK=0 DEADLINE=20 bash scripts/gpu_window.sh
# DEVICE goes to the runner's --device (default auto: the GPU), CHAPTERS to its --chapters (default all).
# CUDA_GRAPHS=1 passes --cuda-graphs (posenc.runs.graphed): only once gpu_costs.sh's graph probe has shown, in a
# window, that graphed steps train as the eager ones and pay with ten workers (graph_decision).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET=${BUDGET:-570}                             # seconds this script may take in all
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "BUDGET must be whole seconds; got '$BUDGET'" >&2; exit 2; }
OUT=${OUT:-/tmp/posenc-gpu-out}
mkdir -p "$OUT"
BEFORE=$(mktemp)                                  # the store as it came: only what this call adds goes back
find results/full -type f | sort > "$BEFORE"
export STAMP=$(mktemp)                             # and what it rewrites (scripts/pack_new.sh)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SELECT=${CHAPTERS:+--chapters $CHAPTERS}
SITE=${SITE:-/tmp/posenc-site}
if compgen -G ".whl/*.whl" > /dev/null; then       # reference libraries the image lacks (scripts/device_wheels.sh)
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; then
        export PYTHONPATH="$PYTHONPATH:$SITE"; echo "carried wheels installed: $(cd .whl && echo *.whl)"
    else
        echo "the carried wheels did not install: the cost table skips what needs them, by name"
    fi
fi
python3 -c "import posenc, torch; print('posenc', posenc.__version__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
{ echo "== before"; python3 -m posenc.runs --profile full $SELECT --dry-run --stack-seeds; } > "$OUT/dry_run.txt" 2>&1
# probe SECTION SECONDS FALLBACK CODE: `python -m posenc.bench --only SECTION` (its table goes to the log), then
# CODE, Python that reads its `rows` and prints the answer; FALLBACK, and why, if either step fails.
probe() {
    local json; json=$(mktemp -d)/probe.json        # a new file: the bench refuses to overwrite one that is not its JSON
    timeout "$2" python3 -m posenc.bench --only "$1" --save "$json" 2>&1 | tee -a "$OUT/runner.log" >&2
    python3 -c "
import json, sys
try:
    rows = json.load(open('$json'))['sections']['$1']['rows']
$4
except Exception as err:
    print('$3'); print('no $1 probe:', err, file=sys.stderr)" 2>> "$OUT/runner.log"
}
: > "$OUT/runner.log"
# A probe that cannot pay is skipped: no stacked groups to decide on, or a tier whose missing runs take under
# two minutes of wall time with ten workers (the probes cost up to 160 s; the 24 randomized-position runs
# left after 2026-12-04 are 0 groups and about 0.7 min).
# PROBES=always runs them whatever the dry run says (the rehearsal tests do).
AUTO=$([ "${PROBES:-auto}" = always ] && echo 0 || echo 1)
if [ "$AUTO" = 1 ] && [ -z "${STACK:-}" ] && grep -q -- "--stack-seeds: 0 of" "$OUT/dry_run.txt"; then
    STACK=0; echo "no stacked groups among the missing runs: the stacking probe is skipped" | tee -a "$OUT/runner.log"
fi
WALL=$(sed -n 's/.*with 10 workers: about \([0-9.]*\) min of wall time.*/\1/p' "$OUT/dry_run.txt" | head -1)
if [ "$AUTO" = 1 ] && [ -z "${WORKERS:-}" ] && [ -n "$WALL" ] && awk "BEGIN { exit !($WALL < 2) }"; then
    WORKERS=10; echo "the missing runs take about $WALL min with 10 workers: the worker probe is skipped" \
        | tee -a "$OUT/runner.log"
fi
[ -n "${STACK:-}" ] || STACK=$(probe stacking 60 0 "
    from posenc.bench.stacking import stack_decision
    ok, why = stack_decision(rows)
    print(int(ok)); print(why, file=sys.stderr)")
echo "stack seeds: $STACK" | tee -a "$OUT/runner.log"
[ -n "${WORKERS:-}" ] || WORKERS=$(probe workers 100 10 "   # how many processes share the GPU: measured
    from posenc.bench.workers import best_count
    print(best_count(rows))")
echo "workers: $WORKERS" | tee -a "$OUT/runner.log"
FLAGS="$([ "$STACK" = 1 ] && echo --stack-seeds) $([ "${CUDA_GRAPHS:-0}" = 1 ] && echo --cuda-graphs)"
# The runner's deadline: what is left of BUDGET after the probes, less 60 s to list, refit and pack the store
# (measured about 25 s) and the runner's start before its clock; at most 400 s unless DEADLINE says otherwise.
SPENT=$(( $(date +%s) - START ))
RUN=1
if [ -z "${DEADLINE:-}" ]; then                             # a computed deadline under 20 s: no runner at all
    DEADLINE=$(( BUDGET - SPENT - 60 < 400 ? BUDGET - SPENT - 60 : 400 ))
    [ "$DEADLINE" -ge 20 ] || RUN=0
fi
echo "deadline: $DEADLINE s ($SPENT s spent of a $BUDGET s budget)" | tee -a "$OUT/runner.log"
STATUS=0
if [ "$RUN" = 0 ]; then
    echo "under 20 s left for the runner: it is not started" | tee -a "$OUT/runner.log"
else
    # While the runner runs, the runs it has finished are re-packed every minute into OUT/interim.tgz (a
    # rename: whole at any moment), so that a call killed at its time limit still brings them back.
    # (TERM ends the loop at once while it sleeps, and after the pack while it packs: never a pack left running.)
    # Its output goes to the log, never to the script's stdout: a sleep left holding that pipe would keep a
    # caller reading it waiting for the sleep's end.
    ( trap 'kill "$nap" 2> /dev/null; exit 0' TERM
      while :; do sleep "${INTERIM_EVERY:-60}" & nap=$!; wait "$nap"
                  INTERIM=1 bash scripts/pack_new.sh "$BEFORE" "$OUT"; done ) >> "$OUT/runner.log" 2>&1 < /dev/null &
    PACKER=$!
    # A hard stop past the deadline too: the runner stops itself there, but the archive must be made in time.
    timeout --kill-after=10 $(( DEADLINE + 45 )) python3 -m posenc.runs --profile full $SELECT \
        --device "${DEVICE:-auto}" --deadline "$DEADLINE" --workers "$WORKERS" $FLAGS 2>&1 | tee -a "$OUT/runner.log"
    STATUS=${PIPESTATUS[0]}
    kill "$PACKER" 2> /dev/null; wait "$PACKER" 2> /dev/null
    echo "runner exit status: $STATUS" | tee -a "$OUT/runner.log"
fi
bash scripts/pack_new.sh "$BEFORE" "$OUT"                 # the runs this call finished, in parts: first
{ echo "== after"; timeout 60 python3 -m posenc.runs --profile full $SELECT --dry-run
  echo "== the cost model refitted to this window"; timeout 60 python3 -m posenc.runs --profile full --fit
} >> "$OUT/dry_run.txt" 2>&1
LEFT=$(( BUDGET - ($(date +%s) - START) ))
if grep -q "^cuda: 0 runs missing" "$OUT/dry_run.txt" && [ "$LEFT" -gt 90 ]; then
    echo "the full tier is done, $LEFT s left: the CUDA cost table"
    OUT="$OUT" LIMIT=$(( LEFT - 15 )) bash scripts/gpu_costs.sh
fi
ls -la "$OUT"
exit "$STATUS"                                            # the runner's: 1 if a run failed
