"""Helpers of scripts/benchmark.py: the synthetic corpus and batch pool (corpus.py), fairseq trainers
for each side (sides.py), torch's fused AdamW as a fairseq optimizer (fused_adamw.py), model FLOPs and
device peaks (flops.py), bytes saved for backward (saved_bytes.py), the timed child runs (timing.py)
and the host-overhead run (host_overhead.py); every benchmark script's --check-args (check_args.py, for
gpu_check.sh's rehearsal)."""
