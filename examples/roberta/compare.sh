#!/usr/bin/env bash
# The parity comparison: run.sh for ls and native with seeds 1..SEEDS (the two implementations of a seed
# run side by side), then results.py --compare over them.
#
#   compare.sh DATA_DIR OUT_DIR [extra fairseq-train arguments]
#
# Environment: SEEDS (3), FROM=DIR (fine-tune only, from DIR/<ls|native>_<seed>'s pretraining: an
# earlier comparison's OUT_DIR), and run.sh's (PYTHON, PRETRAIN_UPDATES, FINETUNE_UPDATES, MODEL, CPU).
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,9p' "$0" >&2; exit 2; fi
DATA=$1 OUT=$2
shift 2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python}
SEEDS=${SEEDS:-3}
FROM=${FROM:-}
for seed in $(seq 1 "$SEEDS"); do
    pids=()
    for impl in ls native; do
        PRETRAINED=${FROM:+$FROM/${impl}_$seed} "$HERE/run.sh" "$impl" "$seed" "$DATA" "$OUT/${impl}_$seed" "$@" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed run stops the comparison
done
"$PYTHON" "$HERE/results.py" --compare $(for s in $(seq 1 "$SEEDS"); do echo "$OUT/ls_$s"; done) -- \
    $(for s in $(seq 1 "$SEEDS"); do echo "$OUT/native_$s"; done) | tee "$OUT/comparison.txt"
