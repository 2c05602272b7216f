# What each example's run.sh begins with, sourced by it (with no arguments, so that it reads and shifts the
# script's own):
#
#   run.sh ls|native SEED DATA_DIR OUT_DIR [extra fairseq-train arguments]
#
# It stops with the script's leading comment (its usage) when fewer than four arguments are given, or an
# IMPL other than ls or native, and sets IMPL SEED DATA OUT (the first four arguments, shifted away: "$@"
# is then the extra fairseq-train arguments), HERE (the script's directory), USER_DIR (the plugin),
# PYTHON (python unless set), BIN (that interpreter's directory, where fairseq's tools are) and CPU (--cpu
# unless CPU is set, even to ""). by_impl LS NATIVE prints the one of its two words that IMPL names.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0" >&2; exit 2; }
if [ $# -lt 4 ]; then usage; fi
IMPL=$1 SEED=$2 DATA=$3 OUT=$4
shift 4
case $IMPL in
    ls|native) ;;
    *) echo "$(basename "$0"): IMPL must be ls or native, not '$IMPL'" >&2; exit 2 ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
USER_DIR=$(cd "$HERE/../.." && pwd)/fairseq_lightseq
PYTHON=${PYTHON:-python}
BIN=$(dirname "$(command -v "$PYTHON")")
CPU=${CPU-"--cpu"}
by_impl() { if [ "$IMPL" = ls ]; then echo "$1"; else echo "$2"; fi; }
