"""The repository's scripts, a package run from the checkout's root with `python -m scripts.NAME`:
the benchmarks (benchmark, bench_ops, bench_criterion, bench_optimizer, bench_generate,
bench_sequence_parallel; their helpers in bench_support/), the GPU check's report (gpu_check_report,
behind gpu_check.sh), and the checkpoint tools (convert_checkpoint, average_checkpoints, which also run
as files: `python scripts/convert_checkpoint.py`)."""
