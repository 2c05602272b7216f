"""Helpers of the benchmark scripts: the synthetic corpus and batch pool (corpus.py), each model family's
shapes and fairseq-train arguments (families.py), fairseq trainers for each side (sides.py), torch's fused
AdamW as a fairseq optimizer (fused_adamw.py), model FLOPs and device peaks (flops.py), bytes saved for
backward (saved_bytes.py), the timed child runs (timing.py) and their processes (children.py), the
sequence-parallel cells (sp_cells.py, sp_gloo.py), the commit and path scrubbing of every JSON written
(provenance.py), and every script's --check-args (check_args.py, for gpu_check.sh's rehearsal)."""
