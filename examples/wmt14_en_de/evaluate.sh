#!/usr/bin/env bash
# Average the last checkpoints, translate the test split, score it.
#
#   evaluate.sh DATA_BIN SAVE_DIR RAW_TEST_REF SPM_MODEL [extra fairseq-generate arguments...]
#
# RAW_TEST_REF: the untokenised reference (prepare.sh's raw test.de, e.g. newstest2014).
# SPM_MODEL: prepare.sh's spm/spm.model; checked against DATA_BIN's dictionary (a model from another
#   preparation would decode the wrong pieces).
# Writes SAVE_DIR/checkpoint_avgN.pt, SAVE_DIR/generate-test.txt, SAVE_DIR/test.hyp; prints
# detokenised sacreBLEU and fairseq's tokenised compound-split BLEU (see score.py).
# Environment: NUM_CHECKPOINTS (5: the last 5 checkpoint_E_U.pt; fewer if fewer exist; 1 = checkpoint_last.pt),
#   BEAM (4), LENPEN (0.6), PYTHON (python). Extra arguments (e.g. --cpu, --max-tokens) go to fairseq-generate.
set -euo pipefail

if [ $# -lt 4 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
DATA_BIN=$1
SAVE_DIR=$2
REF=$3
SPM_MODEL=$4
shift 4
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python}
N=${NUM_CHECKPOINTS:-5}

"$PYTHON" - "$SPM_MODEL" "$DATA_BIN" <<'PY'
import glob, os, sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
for d in sorted(glob.glob(os.path.join(sys.argv[2], "dict.*.txt")))[:1]:
    words = [l.split(" ")[0] for l in open(d, encoding="utf-8") if not l.startswith("madeupword")]
    unknown = [w for w in words if w not in pieces]
    if len(unknown) > 0.01 * max(len(words), 1):
        sys.exit(f"evaluate.sh: {len(unknown)}/{len(words)} entries of {d} are not pieces of {sys.argv[1]} "
                 f"(e.g. {unknown[:5]}): the model and the data come from different preparations")
PY

n_ckpt=$(ls "$SAVE_DIR" | grep -cE '^checkpoint_[0-9]+_[0-9]+\.pt$' || true)
if [ "$N" -gt 1 ] && [ "$n_ckpt" -gt 1 ]; then
    [ "$n_ckpt" -ge "$N" ] || { echo "evaluate.sh: only $n_ckpt update checkpoints in $SAVE_DIR, averaging those"; N=$n_ckpt; }
    CKPT=$SAVE_DIR/checkpoint_avg$N.pt
    "$PYTHON" "$ROOT/scripts/average_checkpoints.py" --inputs "$SAVE_DIR" --num-update-checkpoints "$N" --output "$CKPT"
else
    CKPT=$SAVE_DIR/checkpoint_last.pt
    echo "evaluate.sh: no averaging, decoding $CKPT"
fi

GEN=$SAVE_DIR/generate-test.txt
# --required-batch-size-multiple 1: fairseq-fixed's batch_by_size drops the last batch when its size
# is not a multiple of this (default 8), which would silently skip up to 7 test sentences.
"$PYTHON" -m fairseq_cli.generate "$DATA_BIN" --user-dir "$ROOT/fairseq_lightseq" --path "$CKPT" \
    --gen-subset test --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" --remove-bpe sentencepiece \
    --max-tokens 8000 --required-batch-size-multiple 1 "$@" > "$GEN"
tail -n 1 "$GEN"
"$PYTHON" "$HERE/score.py" "$GEN" "$REF" --out-prefix "$SAVE_DIR/test"
