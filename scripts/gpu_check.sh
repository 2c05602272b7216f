#!/usr/bin/env bash
# The GPU check (docs/gpu_check.md): builds the CUDA extension for sm_90, then runs the steps of a
# profile, most valuable first, inside a time budget, and leaves in OUT_DIR:
#   report.md      each step's status, exit code, time, limit; what was skipped; test summaries, tables
#   summary.json   the same per step, machine-readable (name, status ok/failed/timeout/skipped, rc, seconds, ...)
#   logs.tgz       every log in full (build, pytest with tracebacks, junit xml, benchmark output)
#   *.json         the benchmark results
# usage:
#   scripts/gpu_check.sh OUT_DIR                              the first call: ends by itself within 480 s
#   GPU_CHECK_PROFILE=second scripts/gpu_check.sh OUT_DIR     the optional second call (bf16, per-op, SP)
#   GPU_CHECK_ONLY="tests_rest bench_ops_fp16" scripts/gpu_check.sh OUT_DIR   only those steps (any profile)
#   GPU_CHECK_REHEARSE=1 scripts/gpu_check.sh OUT_DIR         on a CPU machine: every step's command line
#       checked (pytest --collect-only, the scripts' --check-args), nothing measured, the files validated
# More settings: GPU_CHECK_BUDGET (seconds from the script's start; default 480 first, 300 second),
# GPU_CHECK_RESERVE (15: kept for the report and a killed step's grace), GPU_CHECK_CLEAN=1 (rebuild from
# scratch), PYTHON (python3). Each step's limit = min(its cap, budget left - reserve); a step that cannot
# get its minimum is skipped and listed as skipped. The report is rewritten after every step.
# Expects fairseq & co as cp312 wheels in .whl/ (see docs/gpu_check.md) when fairseq is not installed.
set -uo pipefail
OUT_DIR=$(mkdir -p "${1:?usage: scripts/gpu_check.sh OUT_DIR}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
PROFILE=${GPU_CHECK_PROFILE:-first}
ONLY=${GPU_CHECK_ONLY:-}
REHEARSE=${GPU_CHECK_REHEARSE:-0}
case $PROFILE in
  first|all) BUDGET=${GPU_CHECK_BUDGET:-480} ;;
  second) BUDGET=${GPU_CHECK_BUDGET:-300} ;;
  *) echo "GPU_CHECK_PROFILE=$PROFILE: one of first, second, all" >&2; exit 2 ;;
esac
RESERVE=${GPU_CHECK_RESERVE:-15}  # the report, and the grace of a step killed at its limit
GRACE=5  # seconds between timeout's TERM and KILL
LABEL=${ONLY:+only: $ONLY}
LABEL=${LABEL:-$PROFILE}
LOGS=$(mktemp -d)
T0=$SECONDS
STOP=""
FAILED=0
[ "$REHEARSE" = 1 ] && echo "REHEARSAL: command lines only, nothing runs on a GPU"

# The CUDA tests of what has never run on a GPU (since the last GPU run, 2026-11-29 run 2, every kernel
# was rewritten and these came in): the block ops (the C++ autograd nodes) and the SDPA recompute, the
# fused projection + loss in fp16/bf16, the no-sync step, the dropout masks against the CPU, attention,
# bf16 training end to end, attention over packed rows and the packed model (--ls-packed), torch's flash varlen
# attention on packed rows. Defined once: tests_new runs them, tests_rest every other CUDA test.
TESTS_NEW="tests/ops/test_blocks.py tests/ops/test_cross_entropy.py tests/fairseq/test_no_sync.py
  tests/ops/test_dropout.py tests/ops/test_attention.py tests/ops/test_attention_bmm.py tests/e2e/test_bf16.py
  tests/ops/test_varlen_attention.py tests/fairseq/test_packed.py tests/ops/test_embedding.py
  tests/ops/test_flash_attention.py"
TESTS_REST="tests $(for f in $TESTS_NEW; do printf -- '--ignore=%s ' "$f"; done)"
# The steady-state training benchmark of the first call (docs/gpu_check.md: why these sizes fit in 220 s).
BENCH_FIRST="--device cuda --arch-size big --max-tokens 8192 --corpus-pairs 200000 --pool 40 --warmup 40
  --steps 60 --rounds 2 --memory-at 8192"

# The steps after the build, in order of value. One row each:
#   name  profile (first | second | only: run when named in GPU_CHECK_ONLY)  min_s  cap_s  kind  arguments
# kind pytest: `$PY -m pytest -q ... ARGS` (rehearsal: --collect-only, must collect > 0 tests);
# kind py: `$PY ARGS`, a script run as a module of the scripts package (rehearsal: ARGS --check-args). Arguments are expanded by the shell.
# A new model family's benchmark is one row in the second profile (-m scripts.benchmark --family NAME): the LM's
# below (GPT-2-small widths, bf16, T = 1024 and 4096 at 16k tokens, ls / fairseq adam / fused AdamW, MFU),
# first in the second call because that family has never run on a GPU; RoBERTa's next (roberta_base, bf16,
# T = 512 at 16k tokens, masked_lm pretraining; it reuses the LM's corpus, which benchmark_lm made); BART's
# after it (bart_base, bf16, T = 512 at 16k tokens, denoising pretraining on the same corpus).
STEPS='
tests_new        first   30   90  pytest  -m cuda $TESTS_NEW
benchmark        first  150  220  py      -m scripts.benchmark $BENCH_FIRST --precision fp16 --json $OUT_DIR/benchmark.json
bench_attention  first   20   60  py      -m scripts.bench_attention --device cuda --json $OUT_DIR/bench_attention.json
tests_rest       first   30  120  pytest  -m cuda $TESTS_REST
bench_criterion  first   15   40  py      -m scripts.bench_criterion --device cuda
bench_optimizer  first   10   30  py      -m scripts.bench_optimizer --device cuda
kernel_times     first   15   45  py      -m scripts.kernel_profile.gpu_times --shapes base,large --dtype fp16 --json $OUT_DIR/kernel_times.json
benchmark_lm     second 150  220  py      -m scripts.benchmark --family lm --device cuda --warmup 20 --steps 50 --rounds 1 --json $OUT_DIR/benchmark_lm.json
benchmark_roberta second 100 180  py      -m scripts.benchmark --family roberta --device cuda --warmup 20 --steps 50 --rounds 1 --json $OUT_DIR/benchmark_roberta.json
benchmark_bart   second 100  180  py      -m scripts.benchmark --family bart --device cuda --warmup 20 --steps 50 --rounds 1 --json $OUT_DIR/benchmark_bart.json
bench_ops_fp16   second  30   75  py      -m scripts.bench_ops --device cuda --dtype fp16 --shapes base,big,large,long --skip-ref --json $OUT_DIR/bench_ops_fp16.json
benchmark_bf16   second 150  220  py      -m scripts.benchmark $BENCH_FIRST --precision bf16 --json $OUT_DIR/benchmark_bf16.json
benchmark_explicit second 100 200  py      -m scripts.benchmark $BENCH_FIRST --precision fp16,bf16 --sides ls --ls-extra "--ls-attention explicit" --json $OUT_DIR/benchmark_explicit.json
benchmark_padded second 100  200  py      -m scripts.benchmark $BENCH_FIRST --precision fp16,bf16 --sides ls --ls-extra "--ls-packed False" --json $OUT_DIR/benchmark_padded.json
sp_bench         second  60  150  py      -m scripts.bench_sequence_parallel --device cuda --dtype bf16 --lengths 4k 8k 16k 32k --max-gib 100 --warmup 1 --reps 3 --json $OUT_DIR/bench_sequence_parallel_bf16.json
bench_ops_bf16   second  30   75  py      -m scripts.bench_ops --device cuda --dtype bf16 --shapes base,big,large --skip-ref --json $OUT_DIR/bench_ops_bf16.json
tests_cuda       only    60  180  pytest  -m cuda tests
benchmark_full   only   240  420  py      -m scripts.benchmark --device cuda --json $OUT_DIR/benchmark_full.json
benchmark_sweep  only   300  540  py      -m scripts.benchmark --device cuda --sweep --precision fp16,bf16 --json $OUT_DIR/benchmark_sweep.json
'

report() {
  $PY scripts/gpu_check_report.py write "$LOGS" "$OUT_DIR" --profile "$LABEL" \
    --budget "$BUDGET" --reserve "$RESERVE" --elapsed $((SECONDS - T0)) --rehearsal "$REHEARSE" \
    || echo "gpu_check: the report could not be written" >&2
  tar czf "$OUT_DIR/logs.tgz" -C "$LOGS" .
}

# record NAME PROFILE STATUS RC SECONDS LIMIT CAP MIN START REASON: one line of LOGS/steps.tsv
record() {
  local IFS=$'\t'
  echo "$*" >> "$LOGS/steps.tsv"
  printf '%-16s %-8s rc=%-3s %4ss (limit %s s, at %s s) %s\n' "$1" "$3" "$4" "$5" "$6" "$9" "${10}"
}

# step NAME PROFILE MIN CAP CMD...: runs CMD within min(CAP, budget left - reserve) seconds, output to
# LOGS/NAME.txt; skipped (and recorded so) when that is under MIN or an earlier step stopped the run.
step() {
  local name=$1 prof=$2 min=$3 cap=$4 t=$((SECONDS - T0)) rc status reason=""
  shift 4
  local left=$((BUDGET - RESERVE - t))
  local limit=$((cap < left ? cap : left))
  if [ -n "$STOP" ]; then record "$name" "$prof" skipped - 0 - "$cap" "$min" "$t" "$STOP"; report; return 1; fi
  if [ "$limit" -lt "$min" ]; then
    record "$name" "$prof" skipped - 0 - "$cap" "$min" "$t" "budget: ${left} s left, needs ${min} s"
    report
    return 1
  fi
  echo "== $(date +%T) $name (limit ${limit} s)"
  printf '$ %s\n' "$*" > "$LOGS/$name.txt"
  timeout -k "$GRACE" "$limit" "$@" < /dev/null >> "$LOGS/$name.txt" 2>&1
  rc=$?
  if [ "$rc" = 0 ] && [ "$REHEARSE" = 1 ] && [ "${STEP_KIND:-}" = pytest ]; then
    # --collect-only prints "N tests collected" or "N/M tests collected (K deselected)"
    grep -qE '^[1-9][0-9]*(/[0-9]+)? tests? collected' "$LOGS/$name.txt" || { rc=1; reason="collected no tests"; }
  fi
  case $rc in 0) status=ok ;; 124|137) status=timeout; reason="cut at its limit" ;; *) status=failed ;; esac
  [ "$status" = ok ] || FAILED=1
  record "$name" "$prof" "$status" "$rc" $((SECONDS - T0 - t)) "$limit" "$cap" "$min" "$t" "$reason"
  report
  return "$rc"
}

# Setup: machine, wheels, build, info (every profile).
if [ "$REHEARSE" = 1 ]; then
  step machine setup 5 15 bash -c "lscpu | head -20; nproc; $PY --version"
else
  step machine setup 5 15 bash -c "nvidia-smi; nproc; nvcc --version | tail -2; $PY -c \"import torch; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())\""
fi
if $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('fairseq') is None)"; then
  record wheels setup skipped - 0 - 20 5 $((SECONDS - T0)) "not needed: fairseq is installed"
elif ls .whl/*.whl > /dev/null 2>&1; then
  step wheels setup 5 20 $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
else
  record wheels setup skipped - 0 - 20 5 $((SECONDS - T0)) "fairseq is not installed and .whl/ has no wheels"
fi
# Incremental: ninja rebuilds only what changed (headers included), so a second call on the same machine
# costs seconds; a fresh machine has no build/ anyway. GPU_CHECK_CLEAN=1 starts from scratch.
[ "${GPU_CHECK_CLEAN:-0}" = 1 ] && rm -rf build fairseq_lightseq/_C*.so
if [ "$REHEARSE" = 1 ]; then
  step build setup 20 100 $PY -c "import ast; ast.parse(open('setup.py').read()); print('setup.py parses')"
else
  step build setup 20 100 env TORCH_CUDA_ARCH_LIST=9.0 FLS_CUDA=1 MAX_JOBS="$(nproc)" $PY setup.py build_ext --inplace
fi
if [ "$?" != 0 ]; then
  STOP="build did not finish"
  tail -40 "$LOGS/build.txt" 2>/dev/null
fi
step info setup 5 20 $PY -m fairseq_lightseq.info

# The profile's steps, in the table's order.
par=""
$PY -c "import xdist" 2> /dev/null && par="-n 8"
$PY -c "import pytest_timeout" 2> /dev/null && par="$par --timeout 90"
export FLS_REQUIRE_KERNELS=1  # a test must not pass on the PyTorch reference because the build lacks a kernel
while read -r -u 3 name prof min cap kind rest; do
  case $name in ''|'#'*) continue ;; esac
  if [ -n "$ONLY" ]; then
    case " $ONLY " in *" $name "*) ;; *) continue ;; esac
  elif [ "$PROFILE" != all ] && [ "$prof" != "$PROFILE" ]; then
    continue
  fi
  eval "args=($rest)"
  STEP_KIND=$kind
  case $kind:$REHEARSE in
    pytest:1) step "$name" "$prof" "$min" "$cap" $PY -m pytest --collect-only -q -p no:cacheprovider "${args[@]}" ;;
    pytest:*) step "$name" "$prof" "$min" "$cap" $PY -m pytest -q -rfE -p no:cacheprovider $par \
                --junitxml="$LOGS/$name.xml" "${args[@]}" ;;
    py:1) step "$name" "$prof" "$min" "$cap" $PY "${args[@]}" --check-args ;;
    py:*) step "$name" "$prof" "$min" "$cap" $PY "${args[@]}" ;;
    *) echo "gpu_check.sh: step $name: unknown kind $kind" >&2; exit 2 ;;
  esac
  STEP_KIND=""
done 3<<< "$STEPS"

report
if [ "$REHEARSE" = 1 ]; then
  $PY scripts/gpu_check_report.py validate "$OUT_DIR" || FAILED=1
fi
echo "done in $((SECONDS - T0)) s of a ${BUDGET} s budget: $OUT_DIR/report.md"
exit "$FAILED"
