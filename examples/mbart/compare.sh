#!/usr/bin/env bash
# The parity comparison: run.sh for ls and native with seeds 1..SEEDS, one run after the other, then
# results.py --compare over them.
#
#   compare.sh DATA_DIR OUT_DIR [extra fairseq-train arguments]
#
# Environment: SEEDS (3), and run.sh's (PYTHON, PRETRAIN_UPDATES, FINETUNE_UPDATES, MODEL, CPU).
set -euo pipefail
source "$(dirname "$0")/../common/compare_args.sh"   # DATA OUT EXTRA HERE PYTHON SEEDS, compare_seeds
run_seed() {
    local impl
    for impl in ls native; do "$HERE/run.sh" "$impl" "$1" "$DATA" "$OUT/${impl}_$1" "${EXTRA[@]}"; done
}
compare_seeds
