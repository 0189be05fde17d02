#!/usr/bin/env bash
# The store's runs that this device call made, packed as one gzip'd tar for $OUT:
#
#   bash scripts/pack_new.sh LIST OUT            (scripts/gpu_window.sh calls it; the store is results/full)
#   back here: bash scripts/device_unpack.sh <files_at>
#
# A run's files are taken if their path is not in LIST (one path per line, sorted: the store as the call found
# it) or, with STAMP set to a file touched when the call began, if they were written after it (a record or
# weights file rewritten in place: a corrupt record run again). Each run's weights (.pt) go before its record
# (.json): an archive cut short then holds whole runs, and a record without its weights would only be rerun.
# Writers' temporary files (.*.tmp) are never taken.
#
# Final (the default): split into parts of PART bytes (16000k by default) named OUT/store.tgz.0, .1, ...,
# after which OUT/interim.tgz, if any, is removed. The device tool brings back files of at most 16 MiB,
# 8 files, 64 MiB in all: it warns when OUT would hold more than 8 files.
# INTERIM=1: one file, OUT/interim.tgz, replaced by a rename (so a call killed at any moment leaves a whole
# one), and only if it fits in one part; gpu_window.sh makes one every minute while the runner runs.
set -uo pipefail
cd "$(dirname "$0")/.."
LIST=$1 OUT=$2 STORE=${STORE:-results/full}
NEW=$(mktemp) ARCHIVE=$(mktemp)
{ find "$STORE" -type f | sort | comm -13 "$LIST" -
  if [ -n "${STAMP:-}" ]; then find "$STORE" -type f -newer "$STAMP"; fi
} | grep -E '\.(json|pt)$' | grep -v '/\.' | sort -u | sort -t. -k1,1 -k2,2r > "$NEW"
RUNS=$(grep -c '\.json$' "$NEW")
tar czf "$ARCHIVE" -T "$NEW"
SIZE=$(wc -c < "$ARCHIVE")
if [ "${INTERIM:-0}" = 1 ]; then
    LIMIT=$(numfmt --from=iec "${PART:-16000k}" 2>/dev/null || echo 16384000)
    if [ "$SIZE" -le "$LIMIT" ]; then
        cp "$ARCHIVE" "$OUT/.interim.tgz.tmp" && chmod 644 "$OUT/.interim.tgz.tmp" \
            && mv "$OUT/.interim.tgz.tmp" "$OUT/interim.tgz"          # mktemp's 600 would not read as others
        echo "interim: $RUNS runs so far ($SIZE bytes) in $OUT/interim.tgz"
    else
        echo "interim: $RUNS runs so far, $SIZE bytes: over one part, not kept (the final pack splits them)"
    fi
else
    split -b "${PART:-16000k}" -d -a 1 "$ARCHIVE" "$OUT/store.tgz." && rm -f "$OUT/interim.tgz"
    PARTS=$(ls "$OUT" | grep -c '^store\.tgz\.')
    echo "packed $RUNS new runs ($SIZE bytes) as $PARTS part(s) of at most ${PART:-16000k}"
    FILES=$(find "$OUT" -type f | wc -l)
    [ "$FILES" -le 8 ] || echo "WARNING: $OUT holds $FILES files; the device tool brings back 8: unpack what came, the rest reruns"
fi
rm -f "$NEW" "$ARCHIVE"
