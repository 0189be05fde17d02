#!/usr/bin/env bash
# Back here after a device call: the runs it finished unpacked into the store, and their weights set aside so
# that the next call's tree stays under 64 MiB (scripts/device_tree.sh):
#
#   bash scripts/device_unpack.sh <files_at>      e.g. /work/.device/3
#
# <files_at> holds the call's archive parts store.tgz.0, .1, ... (scripts/pack_new.sh) and, if the cost table
# ran, cuda.json. The parts are joined in numeric order; only members under results/full/runs/ are taken.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: bash scripts/device_unpack.sh FILES_AT}
mapfile -t PARTS < <(find "$DIR" -maxdepth 1 -name 'store.tgz.*' | awk -F. '{ print $NF "\t" $0 }' | sort -n | cut -f2-)
if [ "${#PARTS[@]}" -gt 0 ]; then
    cat "${PARTS[@]}" | tar xzf - --no-same-owner --wildcards 'results/full/runs/*'
    echo "unpacked ${#PARTS[@]} part(s) from $DIR"
else
    echo "no archive parts in $DIR: no runs came back"
fi
if [ -f "$DIR/cuda.json" ]; then cp "$DIR/cuda.json" results/bench/cuda.json && echo "results/bench/cuda.json updated"; fi
bash scripts/device_tree.sh aside
