#!/usr/bin/env bash
# Transformer-big on WMT14 En-De with fairseq's scaling_nmt recipe (Ott et al., 2018).
#
#   train.sh DATA_BIN SAVE_DIR [ls|native] [extra fairseq-train arguments...]
#
# ls:     ls_transformer_vaswani_wmt_en_de_big + ls_label_smoothed_cross_entropy + ls_adam (fairseq_lightseq)
# native: transformer_vaswani_wmt_en_de_big + label_smoothed_cross_entropy + adam (fairseq's own)
# Extra arguments come last and so override the recipe's (argparse keeps the last value), e.g.
# "--update-freq 16 --lr 1e-3" for 128-GPU-equivalent batches on 8 GPUs, or a tiny model with --cpu.
# fairseq trains on all visible GPUs (restrict with CUDA_VISIBLE_DEVICES): one process per GPU.
#
# Environment: PRECISION fp16 (default; fp32 when --cpu is among the extra arguments) | bf16 | fp32,
#   SEED (1), PYTHON (python). Rerunning the same command resumes from SAVE_DIR/checkpoint_last.pt.
#   TORCHRUN: torchrun's options; when set, torchrun starts the processes (one per GPU), e.g. on each
#   of 2 machines: TORCHRUN="--nnodes 2 --node_rank R --nproc_per_node 8 --master_addr HOST0 --master_port 29500"
#   (R = 0 on HOST0, 1 on the other). Without torchrun, fairseq's own flags do the same:
#   "--distributed-world-size 16 --distributed-init-method tcp://HOST0:29500 --distributed-rank 0"
#   on HOST0 and "... --distributed-rank 8" on the other (each machine spawns its 8 ranks from there).
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,19p' "$0" >&2
    exit 2
fi
DATA_BIN=$1
SAVE_DIR=$2
VARIANT=${3:-ls}
shift $(( $# < 3 ? $# : 3 ))
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
USER_DIR=$(cd "$HERE/../.." && pwd)/fairseq_lightseq
PYTHON=${PYTHON:-python}

case "$VARIANT" in
    ls) ARCH=ls_transformer_vaswani_wmt_en_de_big; CRITERION=ls_label_smoothed_cross_entropy; OPTIMIZER=ls_adam ;;
    native) ARCH=transformer_vaswani_wmt_en_de_big; CRITERION=label_smoothed_cross_entropy; OPTIMIZER=adam ;;
    *) echo "train.sh: the third argument is ls or native, not '$VARIANT'" >&2; exit 2 ;;
esac

if [ -z "${PRECISION:-}" ]; then
    PRECISION=fp16
    for a in "$@"; do [ "$a" = "--cpu" ] && PRECISION=fp32; done
fi
case "$PRECISION" in
    fp16) PRECISION_ARGS=(--fp16) ;;
    bf16) PRECISION_ARGS=(--bf16) ;;
    fp32) PRECISION_ARGS=() ;;
    *) echo "train.sh: PRECISION must be fp16, bf16 or fp32, not '$PRECISION'" >&2; exit 2 ;;
esac

# torchrun (TORCHRUN set) or fairseq itself starts the processes
if [ -n "${TORCHRUN:-}" ]; then
    read -r -a TORCHRUN_ARGS <<< "$TORCHRUN"
    LAUNCH=("$PYTHON" -m torch.distributed.run "${TORCHRUN_ARGS[@]}" -m fairseq_cli.train)
else
    LAUNCH=("$PYTHON" -m fairseq_cli.train)
fi

# --max-update 300000 at ~29k tokens per update (8 GPUs x --max-tokens 3584 x --update-freq 1) is
# Vaswani et al.'s Transformer-big schedule; checkpoints every 1000 updates, the last 10 kept for averaging.
set -x
exec "${LAUNCH[@]}" "$DATA_BIN" --user-dir "$USER_DIR" \
    --arch "$ARCH" --share-all-embeddings \
    --optimizer "$OPTIMIZER" --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --weight-decay 0.0 \
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-07 \
    --dropout 0.3 --criterion "$CRITERION" --label-smoothing 0.1 \
    --max-tokens 3584 --max-update 300000 \
    --save-dir "$SAVE_DIR" --save-interval-updates 1000 --keep-interval-updates 10 --no-epoch-checkpoints \
    --seed "${SEED:-1}" --log-format simple --log-interval 100 \
    "${PRECISION_ARGS[@]}" "$@"
