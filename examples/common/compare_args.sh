# What each example's compare.sh begins with, sourced by it (with no arguments, so that it reads and shifts
# the script's own):
#
#   compare.sh DATA_DIR OUT_DIR [extra fairseq-train arguments]
#
# It stops with the script's leading comment (its usage) when fewer than two arguments are given, and sets
# DATA OUT (shifted away), EXTRA (the remaining arguments, an array), HERE (the script's directory), PYTHON
# (python unless set), SEEDS (3 unless set). compare_seeds calls the script's run_seed SEED for SEED = 1 ..
# SEEDS, then HERE/results.py --compare over OUT/ls_SEED and OUT/native_SEED, into OUT/comparison.txt.
if [ $# -lt 2 ]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0" >&2; exit 2; fi
DATA=$1 OUT=$2
shift 2
EXTRA=("$@")
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
SEEDS=${SEEDS:-3}
compare_seeds() {
    local seed
    for seed in $(seq 1 "$SEEDS"); do run_seed "$seed"; done
    "$PYTHON" "$HERE/results.py" --compare $(for s in $(seq 1 "$SEEDS"); do echo "$OUT/ls_$s"; done) -- \
        $(for s in $(seq 1 "$SEEDS"); do echo "$OUT/native_$s"; done) | tee "$OUT/comparison.txt"
}
