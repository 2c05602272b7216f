#!/usr/bin/env bash
# The parity comparison: run.sh for ls and native with seeds 1..SEEDS (the two implementations of a seed
# run side by side), then results.py --compare over them.
#
#   compare.sh DATA_DIR OUT_DIR [extra fairseq-train arguments]
#
# Environment: SEEDS (3), FROM=DIR (fine-tune only, from DIR/<ls|native>_<seed>'s pretraining: an
# earlier comparison's OUT_DIR), and run.sh's (PYTHON, PRETRAIN_UPDATES, FINETUNE_UPDATES, MODEL, CPU).
set -euo pipefail
source "$(dirname "$0")/../common/compare_args.sh"   # DATA OUT EXTRA HERE PYTHON SEEDS, compare_seeds
FROM=${FROM:-}
run_seed() {
    local impl pid pids=()
    for impl in ls native; do
        PRETRAINED=${FROM:+$FROM/${impl}_$1} "$HERE/run.sh" "$impl" "$1" "$DATA" "$OUT/${impl}_$1" "${EXTRA[@]}" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed run stops the comparison
}
compare_seeds
