#!/usr/bin/env bash
# One seed of the RoBERTa parity comparison: masked-LM pretraining, then the en/de sentence classifier
# fine-tuned from it (fairseq's GLUE flags), for one implementation.
#
#   run.sh ls|native SEED DATA_DIR OUT_DIR [extra fairseq-train arguments for both runs]
#
# DATA_DIR: prepare.py's output (mlm-bin, cls-bin). OUT_DIR/{pretrain,finetune} get the checkpoints and
# logs (train.log, json); OUT_DIR/results.txt the final pretraining validation loss and the classifier's
# validation and test accuracy. Both implementations get the same settings; only the model, criterion
# and optimizer names differ (ls: ls_roberta, ls_masked_lm, ls_adam; native: roberta, masked_lm, adam).
# Environment: PYTHON (python), PRETRAIN_UPDATES (1000), FINETUNE_UPDATES (300), MODEL (a tiny encoder:
# 2 layers, width 64); CPU unless CPU="" is set; PRETRAINED=DIR skips the pretraining and fine-tunes from
# DIR/pretrain/checkpoint_last.pt (an earlier run's OUT_DIR, e.g. for a shorter fine-tuning).
set -euo pipefail
source "$(dirname "$0")/../common/run_args.sh"   # IMPL SEED DATA OUT HERE USER_DIR PYTHON BIN CPU, by_impl
PRETRAIN_UPDATES=${PRETRAIN_UPDATES:-1000}
FINETUNE_UPDATES=${FINETUNE_UPDATES:-300}
MODEL=${MODEL:-"--encoder-layers 2 --encoder-embed-dim 64 --encoder-ffn-embed-dim 256 --encoder-attention-heads 4"}
ARCH=$(by_impl ls_roberta roberta)
MLM=$(by_impl ls_masked_lm masked_lm)
OPT=$(by_impl ls_adam adam)
mkdir -p "$OUT/pretrain" "$OUT/finetune"
# --user-dir for both: the native run needs the plugin only for numpy 2 (fairseq's np.compat.long)
COMMON=(--user-dir "$USER_DIR" --arch "$ARCH" --optimizer "$OPT" $MODEL --seed "$SEED" $CPU --num-workers 0
        --adam-betas "(0.9,0.98)" --adam-eps 1e-6 --clip-norm 0.0 --weight-decay 0.01 --dropout 0.1
        --attention-dropout 0.1 --lr-scheduler polynomial_decay --no-epoch-checkpoints --log-format json
        --log-interval 50 --max-positions 128 --skip-invalid-size-inputs-valid-test)

PRETRAINED=${PRETRAINED:-}
if [ -n "$PRETRAINED" ]; then
    [ "$PRETRAINED" -ef "$OUT" ] || { rm -rf "$OUT/pretrain"; cp -r "$PRETRAINED/pretrain" "$OUT/pretrain"; }
else
"$BIN/fairseq-train" "$DATA/mlm-bin" --task masked_lm --criterion "$MLM" "${COMMON[@]}" \
    --tokens-per-sample 126 --sample-break-mode eos --max-tokens 2048 --lr 2e-3 --warmup-updates 100 \
    --total-num-update "$PRETRAIN_UPDATES" --max-update "$PRETRAIN_UPDATES" --validate-interval-updates 250 \
    --save-dir "$OUT/pretrain" "$@" 2>&1 | tee "$OUT/pretrain/train.log" >/dev/null
fi

"$BIN/fairseq-train" "$DATA/cls-bin" --task sentence_prediction --criterion sentence_prediction --num-classes 2 \
    --init-token 0 --separator-token 2 "${COMMON[@]}" --batch-size 32 --lr 5e-4 \
    --warmup-updates $((FINETUNE_UPDATES / 10)) --total-num-update "$FINETUNE_UPDATES" --max-update "$FINETUNE_UPDATES" \
    --restore-file "$OUT/pretrain/checkpoint_last.pt" --reset-optimizer --reset-dataloader --reset-meters \
    --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric --save-dir "$OUT/finetune" "$@" \
    2>&1 | tee "$OUT/finetune/train.log" >/dev/null
"$BIN/fairseq-validate" "$DATA/cls-bin" --user-dir "$USER_DIR" --task sentence_prediction \
    --criterion sentence_prediction --num-classes 2 --init-token 0 --separator-token 2 --max-positions 128 \
    --path "$OUT/finetune/checkpoint_last.pt" --valid-subset valid,test --batch-size 64 $CPU --num-workers 0 \
    2>&1 | tee "$OUT/finetune/validate.log" >/dev/null

"$PYTHON" "$HERE/results.py" "$OUT" | tee "$OUT/results.txt"
