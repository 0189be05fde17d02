#!/usr/bin/env bash
# Rehearse chapters as a Colab CPU runtime runs them, without Colab:
#
#   bash scripts/rehearse_colab.sh 07_t5 15_comparison findings
#
# A bare virtual environment (torch, papermill and ipykernel; no posenc) runs each chapter's Colab copy
# (notebooks/colab/, what the badge opens) with papermill, its
# install cell pointed at this checkout's last commit (file://) instead of GitHub: the cell clones it, installs it
# with its `notebooks` extra, and the chapter reads the clone's committed runs. Each chapter's text outputs are then
# compared with the ones the book stores; a chapter that fails, or whose text differs, is named and the script exits
# non-zero. TRANSFORMERS=5.0.0 tries an older transformers (the extra's floor). The environment takes about a
# minute to build; a chapter takes seconds. Everything is made under a throwaway folder (KEEP=<folder> keeps it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || { echo "usage: bash scripts/rehearse_colab.sh CHAPTER [CHAPTER ...]   (e.g. 07_t5)" >&2; exit 2; }
for name in "$@"; do
    [ -f "$ROOT/notebooks/$name.ipynb" ] || { echo "no notebook notebooks/$name.ipynb" >&2; exit 2; }
done
WORK=${KEEP:-$(mktemp -d)}
mkdir -p "$WORK"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT
URL=$(python3 -c "import yaml; print(yaml.safe_load(open('$ROOT/_config.yml'))['repository']['url'].rstrip('/'))")
python3 -m venv "$WORK/env"
"$WORK/env/bin/pip" install -q torch==2.13.0 papermill ipykernel ${TRANSFORMERS:+"transformers==$TRANSFORMERS"}
failed=0
for name in "$@"; do
    sed "s#$URL#file://$ROOT#" "$ROOT/notebooks/colab/$name.ipynb" > "$WORK/$name.ipynb"
    if ! (cd "$WORK" && env -u PYTHONPATH -u POSENC_CI_STORE "$WORK/env/bin/papermill" "$name.ipynb" "out_$name.ipynb" \
            -k python3 --log-level ERROR > "log_$name.txt" 2>&1); then
        echo "$name: FAILED (the end of $WORK/log_$name.txt:)"; tail -n 15 "$WORK/log_$name.txt"; failed=1; continue
    fi
    python3 - "$ROOT/notebooks/$name.ipynb" "$WORK/out_$name.ipynb" "$name" <<'PY' || failed=1
import json, sys

def texts(path):
    """Each code cell's stdout and text/plain, text/markdown outputs (stderr, which holds warnings, left out; a cell
    that nbval does not compare, timings say, is None)."""
    out = []
    for cell in json.load(open(path))["cells"]:
        if "injected-parameters" in cell["metadata"].get("tags", []):
            continue                                    # the book's last papermill run; the copy has none
        if cell["cell_type"] == "code" and "nbval-ignore-output" in cell["metadata"].get("tags", []):
            out.append(None)
        elif cell["cell_type"] == "code":
            out.append("".join("".join(o.get("text", "")) if o.get("name") != "stderr" else "" for o in cell["outputs"])
                       + "".join("".join(o.get("data", {}).get(k, "")) for o in cell["outputs"]
                                 for k in ("text/plain", "text/markdown")))
    return out

book, colab = texts(sys.argv[1]), texts(sys.argv[2])
differ = [i for i, (a, b) in enumerate(zip(book, colab)) if a != b]
print(f"{sys.argv[3]}: ran; {len(colab)} code cells, {len(differ)} whose text differs from the book's {differ or ''}")
sys.exit(1 if differ or len(book) != len(colab) else 0)
PY
done
exit $failed
