#!/usr/bin/env bash
# Sets the store's weights aside before a device call, and puts them back after:
#
#   bash scripts/device_tree.sh aside    every results/*/runs/*.pt moved to .weights-aside/ (ignored by git),
#                                        an empty file left in its place; again after unpacking a call's runs,
#                                        it sets aside the weights that came back (those already aside stay)
#   bash scripts/device_tree.sh back     each one put back where it was, and .weights-aside/ removed
#
# Why: a device call sends the working tree, which must stay under 64 MiB, and the runs' weights (runs
# declared with keep_weights=True, about 3.5 MB each) would take it past that. The runner there reads the
# records alone; the empty file keeps a record whole (posenc.runs.Store.get asks that its weights file
# exists), so no finished run is rerun. Always `back` before committing: tests/test_runs.py fails on
# an empty weights file.
set -euo pipefail
cd "$(dirname "$0")/.."
ASIDE=.weights-aside
case "${1:-}" in
    aside)
        n=0
        while IFS= read -r f; do
            if [ -e "$ASIDE/$f" ]; then echo "$ASIDE/$f exists and $f is not empty: put back first ('back')" >&2; exit 1; fi
            mkdir -p "$ASIDE/$(dirname "$f")"
            mv "$f" "$ASIDE/$f" && : > "$f"
            n=$((n + 1))
        done < <(find results -path '*/runs/*.pt' -type f -size +0 | sort)
        echo "$n weights files set aside in $ASIDE/ (empty files in their place)";;
    back)
        if [ ! -d "$ASIDE" ]; then echo "nothing to put back: no $ASIDE/" >&2; exit 1; fi
        n=0
        while IFS= read -r f; do
            mv "$f" "${f#"$ASIDE"/}"
            n=$((n + 1))
        done < <(find "$ASIDE" -type f | sort)
        rm -r "$ASIDE"
        echo "$n weights files put back";;
    *)
        echo "usage: bash scripts/device_tree.sh aside|back" >&2; exit 2;;
esac
