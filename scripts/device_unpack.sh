#!/usr/bin/env bash
# Back here after a device call: the runs it finished unpacked into the store, and their weights set aside so
# that the next call's tree stays under 64 MiB (scripts/device_tree.sh):
#
#   bash scripts/device_unpack.sh <files_at>      e.g. /work/.device/3
#
# <files_at> holds the call's archive parts store.tgz.0, .1, ... (scripts/pack_new.sh), or, from a call killed
# before its final pack, the interim archive interim.tgz, and, if the cost table ran, cuda.json.
# scripts/unpack_runs.py takes from them every run read whole (an archive cut short gives the runs before the
# cut, never half a file) into results/full/runs, and only there.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: bash scripts/device_unpack.sh FILES_AT}
python3 scripts/unpack_runs.py "$DIR" results/full/runs
if [ -f "$DIR/cuda.json" ]; then cp "$DIR/cuda.json" results/bench/cuda.json && echo "results/bench/cuda.json updated"; fi
bash scripts/device_tree.sh aside
