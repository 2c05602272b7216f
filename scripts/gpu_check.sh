#!/usr/bin/env bash
# The one GPU check (docs/gpu_check.md): builds the CUDA extension for sm_90, runs the CUDA tests and
# the benchmarks, and leaves a few files in OUT_DIR:
#   report.md     each step's exit code and time, the test summary and every benchmark table
#   logs.tgz      every log in full (build, pytest with tracebacks, junit xml, benchmark output)
#   *.json        the benchmark results
#   usage: scripts/gpu_check.sh OUT_DIR        (about 9-10 minutes on an H200, estimated; every step has a time limit)
#   GPU_CHECK_ONLY="tests_cuda bench_ops_fp16" scripts/gpu_check.sh OUT_DIR   runs only those steps
#   (after machine, wheels, build and info), for a short second run.
# The report is rewritten after every step, so a run cut short still leaves what it got.
# Expects fairseq & co as cp312 wheels in .whl/ (see docs/gpu_check.md) when fairseq is not installed.
set -uo pipefail
OUT_DIR=$(mkdir -p "${1:?usage: scripts/gpu_check.sh OUT_DIR}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
LOGS=$(mktemp -d)
T0=$SECONDS

report() {
  {
    echo "# GPU check $(date -u +%F)"
    echo
    echo '```'
    cat "$LOGS/steps.txt"
    echo '```'
    for f in machine info tests_cuda sp sp_bench bench_ops_fp16 bench_ops_bf16 benchmark benchmark_sweep bench_criterion bench_optimizer; do
      [ -s "$LOGS/$f.txt" ] || continue
      echo; echo "## $f"; echo '```'
      case $f in
        tests_cuda|sp) grep -E "^(FAILED|ERROR)|passed|failed|error" "$LOGS/$f.txt" | tail -60 ;;
        *) tail -60 "$LOGS/$f.txt" ;;
      esac
      echo '```'
    done
  } > "$OUT_DIR/report.md"
  tar czf "$OUT_DIR/logs.tgz" -C "$LOGS" .
}

# step NAME LIMIT_S CMD...: runs CMD with a time limit, output to $LOGS/NAME.txt; never stops the script.
step() {
  local name=$1 limit=$2 t=$SECONDS rc
  shift 2
  case " machine wheels build info ${GPU_CHECK_ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $(date +%T) $name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.txt" 2>&1
  rc=$?
  printf '%-18s rc=%-3s %4ss  (at %ss)\n' "$name" "$rc" $((SECONDS - t)) $((SECONDS - T0)) | tee -a "$LOGS/steps.txt"
  report
  return $rc
}

step machine 60 bash -c "nvidia-smi; nproc; nvcc --version | tail -2; $PY -c \"import torch; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())\""

if ! $PY -c "import fairseq" 2>/dev/null && ls .whl/*.whl > /dev/null 2>&1; then
  step wheels 120 $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi

rm -rf build fairseq_lightseq/_C*.so
if ! step build 300 env TORCH_CUDA_ARCH_LIST=9.0 FLS_CUDA=1 MAX_JOBS=$(nproc) $PY setup.py build_ext --inplace; then
  tail -40 "$LOGS/build.txt"
  exit 1
fi
step info 60 $PY -m fairseq_lightseq.info

# The CUDA tests, spread over 8 workers where pytest-xdist is there; 90 s per test at most.
par=""
$PY -c "import xdist" 2> /dev/null && par="-n 8"
$PY -c "import pytest_timeout" 2> /dev/null && par="$par --timeout 90"
step tests_cuda 150 $PY -m pytest -q -m cuda $par -rfE -p no:cacheprovider tests --junitxml="$LOGS/tests_cuda.xml"
# Sequence parallelism's ops on CUDA (seconds): attention dropout coordinates against the CPU kernel
# (the same masks, bit for bit) and token-wise row slices against the full call. Also part of tests_cuda;
# on its own for GPU_CHECK_ONLY=sp.
step sp 180 $PY -m pytest -q -m cuda -rfE -p no:cacheprovider tests/ops/test_attention_coords.py \
  tests/ops/test_token_slices.py --junitxml="$LOGS/sp.xml"
# Sequence parallelism's memory per rank on the GPU, bf16 Transformer-big, rank 0 of P over the fake process
# group (SDPA attention: nothing T x T kept), T = 4k..32k: saved bytes, CUDA peak, bytes sent, time.
step sp_bench 150 $PY scripts/bench_sequence_parallel.py --device cuda --dtype bf16 --lengths 4k 8k 16k 32k \
  --max-gib 100 --warmup 1 --reps 3 --json "$OUT_DIR/bench_sequence_parallel_bf16.json"

step bench_ops_fp16 150 $PY scripts/bench_ops.py --device cuda --dtype fp16 --shapes base,big,large,long --skip-ref --json "$OUT_DIR/bench_ops_fp16.json"
step bench_ops_bf16 120 $PY scripts/bench_ops.py --device cuda --dtype bf16 --shapes base,big,large --skip-ref --json "$OUT_DIR/bench_ops_bf16.json"
# Training speed at steady state (scripts/benchmark.py's CUDA default, about 4 minutes): Transformer-big
# fp16 at 8192 tokens on a pool of 100 batches, 50 warm-up + 100 timed steps per side, ls / fairseq adam /
# fairseq + torch fused AdamW in turns, MFU, activation memory at 8k and 32k tokens, syncs per step,
# GPU-busy fraction. GPU_CHECK_SWEEP=1 adds the 4096..32768 sweep in fp16 and bf16 (much longer).
step benchmark 420 $PY scripts/benchmark.py --device cuda --json "$OUT_DIR/benchmark.json"
if [ "${GPU_CHECK_SWEEP:-0}" = 1 ]; then
  step benchmark_sweep 1800 $PY scripts/benchmark.py --device cuda --sweep --precision fp16,bf16 --json "$OUT_DIR/benchmark_sweep.json"
fi
step bench_criterion 60 $PY scripts/bench_criterion.py --device cuda
step bench_optimizer 60 $PY scripts/bench_optimizer.py --device cuda
echo "done in $((SECONDS - T0)) s: $OUT_DIR/report.md"
