#!/usr/bin/env bash
# The parity comparison: run.sh for ls and native with seeds 1..SEEDS, one run after the other, then
# results.py --compare over them.
#
#   compare.sh DATA_DIR OUT_DIR [extra fairseq-train arguments]
#
# Environment: SEEDS (3), and run.sh's (PYTHON, PRETRAIN_UPDATES, FINETUNE_UPDATES, MODEL, CPU).
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,7p' "$0" >&2; exit 2; fi
DATA=$1 OUT=$2
shift 2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python}
SEEDS=${SEEDS:-3}
for seed in $(seq 1 "$SEEDS"); do
    for impl in ls native; do
        "$HERE/run.sh" "$impl" "$seed" "$DATA" "$OUT/${impl}_$seed" "$@"
    done
done
"$PYTHON" "$HERE/results.py" --compare $(for s in $(seq 1 "$SEEDS"); do echo "$OUT/ls_$s"; done) -- \
    $(for s in $(seq 1 "$SEEDS"); do echo "$OUT/native_$s"; done) | tee "$OUT/comparison.txt"
