#!/usr/bin/env bash
# One seed of the mBART parity comparison, for one implementation: multilingual denoising pretraining on
# the English and German sentences, then the en-de translation fine-tuned from it
# (translation_from_pretrained_bart), then fairseq-generate on the test split and sacreBLEU.
#
#   run.sh ls|native SEED DATA_DIR OUT_DIR [extra fairseq-train arguments for both runs]
#
# DATA_DIR: prepare.py's output (mono, pair, spm.model). OUT_DIR/{pretrain,finetune} get the checkpoints and
# logs; OUT_DIR/test.hyp the detokenized translations; OUT_DIR/results.txt the last validation losses and
# the test BLEU. Both implementations get the same settings; only the model, criterion and optimizer names
# differ (ls: ls_mbart_base, ls_label_smoothed_cross_entropy, ls_adam; native: mbart_base,
# label_smoothed_cross_entropy, adam). Environment: PYTHON (python), PRETRAIN_UPDATES (1000),
# FINETUNE_UPDATES (1000), MODEL (a small mbart_base: 2 + 2 layers, width 128); CPU unless CPU="" is set;
# PRETRAINED=FILE fine-tunes from FILE (e.g. fairseq's mbart.cc25 model.pt with its MODEL) instead.
set -euo pipefail
source "$(dirname "$0")/../common/run_args.sh"   # IMPL SEED DATA OUT HERE USER_DIR PYTHON BIN CPU, by_impl
PRETRAIN_UPDATES=${PRETRAIN_UPDATES:-1000}
FINETUNE_UPDATES=${FINETUNE_UPDATES:-1000}
MODEL=${MODEL:-"--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128
       --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4
       --decoder-attention-heads 4"}
LANGS=${LANGS:-en,de}
ARCH=$(by_impl ls_mbart_base mbart_base)
CRIT=$(by_impl ls_label_smoothed_cross_entropy label_smoothed_cross_entropy)
OPT=$(by_impl ls_adam adam)
mkdir -p "$OUT/pretrain" "$OUT/finetune"
# --user-dir for both: fairseq's translation_from_pretrained_bart needs the plugin's fix with any model
COMMON=(--user-dir "$USER_DIR" --arch "$ARCH" --criterion "$CRIT" --label-smoothing 0.1 --optimizer "$OPT"
        $MODEL --seed "$SEED" $CPU --num-workers 0 --adam-betas "(0.9,0.98)" --adam-eps 1e-6 --weight-decay 0.01
        --dropout 0.1 --attention-dropout 0.1 --lr-scheduler polynomial_decay --no-epoch-checkpoints
        --log-format json --log-interval 50 --max-tokens 4096 --skip-invalid-size-inputs-valid-test)

PRETRAINED=${PRETRAINED:-}
if [ -z "$PRETRAINED" ]; then
    "$BIN/fairseq-train" "$DATA/mono" --task multilingual_denoising --langs "$LANGS" --add-lang-token \
        --mask 0.3 --mask-random 0.1 --poisson-lambda 3.5 --mask-length span-poisson --replace-length 1 \
        --rotate 0 --permute-sentences 0 --tokens-per-sample 128 "${COMMON[@]}" --lr 1e-3 \
        --warmup-updates $((PRETRAIN_UPDATES / 10)) --total-num-update "$PRETRAIN_UPDATES" \
        --max-update "$PRETRAIN_UPDATES" --validate-interval-updates $((PRETRAIN_UPDATES / 4)) \
        --save-dir "$OUT/pretrain" "$@" 2>&1 | tee "$OUT/pretrain/train.log" >/dev/null
    PRETRAINED=$OUT/pretrain/checkpoint_last.pt
fi

PAIR=(--task translation_from_pretrained_bart --langs "$LANGS" --source-lang en --target-lang de)
"$BIN/fairseq-train" "$DATA/pair" "${PAIR[@]}" "${COMMON[@]}" --lr 5e-4 \
    --warmup-updates $((FINETUNE_UPDATES / 10)) --total-num-update "$FINETUNE_UPDATES" \
    --max-update "$FINETUNE_UPDATES" --validate-interval-updates $((FINETUNE_UPDATES / 4)) \
    --restore-file "$PRETRAINED" --reset-optimizer --reset-dataloader --reset-meters \
    --save-dir "$OUT/finetune" "$@" 2>&1 | tee "$OUT/finetune/train.log" >/dev/null
"$BIN/fairseq-generate" "$DATA/pair" --user-dir "$USER_DIR" "${PAIR[@]}" --path "$OUT/finetune/checkpoint_last.pt" \
    --gen-subset test --beam 5 --max-len-a 1.2 --max-len-b 10 --batch-size 128 --post-process sentencepiece \
    $CPU --num-workers 0 \
    2>&1 | tee "$OUT/finetune/generate.log" >/dev/null
grep '^D-' "$OUT/finetune/generate.log" | sort -t- -k2 -n | cut -f3 > "$OUT/test.hyp"

"$PYTHON" "$HERE/results.py" "$OUT" "$DATA/raw/test.de" | tee "$OUT/results.txt"
