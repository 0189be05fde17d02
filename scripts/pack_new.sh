#!/usr/bin/env bash
# The store's files that are not in LIST (one path per line, sorted: the store as a device call found it),
# packed as one gzip'd tar split into parts of PART bytes (16000k by default) named OUT/store.tgz.0, .1, ...
#
#   bash scripts/pack_new.sh LIST OUT          (scripts/gpu_window.sh calls it; the store is results/full)
#   back here: cat <files_at>/store.tgz.* | tar xzf -
#
# The device tool brings back files of at most 16 MiB, 8 files, 64 MiB in all. Each run's weights (.pt) go
# before its record (.json): an archive cut short then holds whole runs, and a record without its weights
# would only be rerun. Prints how many runs it packed, and warns past 4 parts (the window's share of 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
LIST=$1 OUT=$2 STORE=${STORE:-results/full}
NEW=$(mktemp) ARCHIVE=$(mktemp)
find "$STORE" -type f | sort | comm -13 "$LIST" - | grep -E '\.(json|pt)$' | sort -t. -k1,1 -k2,2r > "$NEW"
tar czf "$ARCHIVE" -T "$NEW" && split -b "${PART:-16000k}" -d -a 1 "$ARCHIVE" "$OUT/store.tgz."
PARTS=$(ls "$OUT" | grep -c '^store\.tgz\.')
echo "packed $(grep -c '\.json$' "$NEW") new runs ($(wc -c < "$ARCHIVE") bytes) as $PARTS part(s) of at most ${PART:-16000k}"
[ "$PARTS" -le 4 ] || echo "WARNING: $PARTS parts; the device tool brings back 8 files: unpack what came, the rest reruns"
rm -f "$NEW" "$ARCHIVE"
