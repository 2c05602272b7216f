#!/usr/bin/env python
"""Convert a fairseq checkpoint between fairseq_lightseq's implementations and fairseq's own.

    python scripts/convert_checkpoint.py IN.pt OUT.pt --to lightseq   # fairseq's -> ls_*
    python scripts/convert_checkpoint.py IN.pt OUT.pt --to fairseq    # ls_* -> fairseq's

Our models, criteria and optimizer share their state exactly with fairseq's (the pairs are listed in
fairseq_lightseq/models/families.py), so only the names a checkpoint records change; model weights, optimizer state (Adam's step/exp_avg/exp_avg_sq per parameter, in the same
parameter order, and fp16 loss scale), lr scheduler, num_updates, dataloader position and everything
else are kept as they are:

  model      transformer_X, transformer_lm_X (arch)  <-> ls_transformer_X, ls_transformer_lm_X
  criterion  label_smoothed_cross_entropy            <-> ls_label_smoothed_cross_entropy
             cross_entropy                           <-> ls_cross_entropy
  optimizer  adam                                    <-> ls_adam

The names are rewritten where fairseq records them: `cfg.model` (`_name`, `arch`, and a legacy
model's copies of `criterion`/`optimizer`), `cfg.criterion._name`, `cfg.optimizer._name`, the old
`args`, and the class names in `optimizer_history` that `--restore-file` checks against the running
criterion and optimizer (LabelSmoothedCrossEntropyCriterion/LsLabelSmoothedCrossEntropyCriterion, ...,
FairseqAdam/LSAdam; fp16 wrappers such as FP16Optimizer are the same for both). A run can therefore
switch implementations mid-training: train natively, convert with --to lightseq, and continue with
`--restore-file OUT.pt --arch ls_transformer_X --criterion ls_label_smoothed_cross_entropy
--optimizer ls_adam` (no --reset-optimizer): num_updates, the lr schedule and the Adam moments carry
on. `--parts` limits the conversion (e.g. `--parts model` to keep fairseq's adam with the ls model).
A criterion or optimizer without a counterpart (e.g. nag) is left as it is. To `lightseq` the
converted checkpoint needs `--user-dir fairseq_lightseq` as usual.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_lightseq.checkpoints.convert import PARTS, convert_state  # noqa: E402
from fairseq_lightseq.checkpoints import io as checkpoint_io  # noqa: E402  (the safe loader, clear read errors)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--to", required=True, choices=["fairseq", "lightseq"])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to convert (default: all three)")
    args = parser.parse_args(argv)
    with checkpoint_io.exit_on_read_error("convert_checkpoint.py"):  # one line, as fairseq-generate says it
        state = checkpoint_io.load_file(args.input)
    try:
        changes = convert_state(state, args.to, args.parts)
    except ValueError as e:  # a checkpoint of the other side, or one recording no architecture
        raise SystemExit(f"convert_checkpoint.py: {args.input}: {e}") from None
    tmp = args.output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    print(f"wrote {args.output} ({args.to}): " + "; ".join(dict.fromkeys(changes)))


if __name__ == "__main__":
    main()
