#!/usr/bin/env bash
# The one GPU check (../shared/GPU.md): builds the CUDA extension for sm_90, runs the CUDA tests and
# the benchmarks, and leaves everything under OUT_DIR (JSON, logs and report.md).
#   usage: scripts/gpu_check.sh OUT_DIR        (about 8 minutes on an H200)
# Expects fairseq & co as cp312 wheels in .whl/ (see GPU.md) when fairseq is not installed.
set -uo pipefail
OUT_DIR=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT_DIR/steps.log"; }

log "1. machine"
{ nvidia-smi; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; nvcc --version | tail -2; } 2>&1 | tee "$OUT_DIR/machine.txt"

if ! $PY -c "import fairseq" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  log "installing fairseq wheels from .whl/"
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi

log "2. build for sm_90"
rm -rf build fairseq_lightseq/_C*.so
if ! TORCH_CUDA_ARCH_LIST=9.0 FLS_CUDA=1 MAX_JOBS=16 $PY setup.py -q build_ext --inplace > "$OUT_DIR/build.log" 2>&1; then
  tail -50 "$OUT_DIR/build.log"; log "BUILD FAILED"; exit 1
fi
$PY -m fairseq_lightseq.info 2>&1 | tee "$OUT_DIR/info.txt"

log "3. tests (CUDA ones and the rest)"
timeout 240 $PY -m pytest -q -x -m cuda tests --junitxml="$OUT_DIR/tests_cuda.xml" 2>&1 | tail -30 | tee "$OUT_DIR/tests_cuda.txt"
timeout 180 $PY -m pytest -q -m "not cuda and not e2e" tests 2>&1 | tail -5 | tee "$OUT_DIR/tests_cpu.txt"

log "4. benchmarks"
for dt in fp16 bf16; do
  timeout 120 $PY scripts/bench_ops.py --device cuda --dtype $dt --json "$OUT_DIR/bench_ops_$dt.json" 2>&1 | tee "$OUT_DIR/bench_ops_$dt.txt"
done
for s in bench_criterion bench_optimizer benchmark; do
  [ -f scripts/$s.py ] && timeout 150 $PY scripts/$s.py --device cuda 2>&1 | tail -40 | tee "$OUT_DIR/$s.txt"
done

log "5. report"
{
  echo "# GPU check $(date -u +%F) on $($PY -c 'import torch; print(torch.cuda.get_device_name())')"
  for f in info tests_cuda tests_cpu bench_ops_fp16 bench_ops_bf16 bench_criterion bench_optimizer benchmark; do
    [ -f "$OUT_DIR/$f.txt" ] && { echo; echo "## $f"; echo '```'; cat "$OUT_DIR/$f.txt"; echo '```'; }
  done
} > "$OUT_DIR/report.md"
log "done: $OUT_DIR/report.md"
