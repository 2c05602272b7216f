"""Average the parameters of the last N checkpoints of a fairseq run (fairseq's
scripts/average_checkpoints.py, which the fairseq wheel does not install, rewritten small).

    python scripts/average_checkpoints.py --inputs SAVE_DIR --num-update-checkpoints 5 --output avg.pt
    python scripts/average_checkpoints.py --inputs SAVE_DIR --num-epoch-checkpoints 5 --output avg.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

The output is the newest input checkpoint with its "model" replaced by the element-wise mean
(accumulated in float64, stored in each parameter's dtype), so fairseq-generate reads it like any
checkpoint. Files are read through fairseq_lightseq (torch's safe loader, clear errors for damaged
files) and written atomically.
"""
import argparse
import collections
import os
import re
import sys

import torch
from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fairseq_lightseq  # noqa: E402,F401  (safe-loader allowlist, checkpoint read errors)
from fairseq import checkpoint_utils  # noqa: E402
from fairseq_lightseq.checkpoints import io as checkpoint_io  # noqa: E402


def last_checkpoints(save_dir: str, n: int, by_update: bool):
    """The n newest checkpoint_E_U.pt (by_update) or checkpointE.pt files of save_dir, newest first."""
    pattern = re.compile(r"^checkpoint_\d+_(\d+)\.pt$" if by_update else r"^checkpoint(\d+)\.pt$")
    found = sorted(((int(m.group(1)), f) for f in os.listdir(save_dir) if (m := pattern.match(f))), reverse=True)
    if len(found) < n:
        kind = "checkpoint_EPOCH_UPDATES.pt" if by_update else "checkpointEPOCH.pt"
        raise SystemExit(f"average_checkpoints.py: asked for {n} {kind} files, {save_dir} has {len(found)}")
    return [os.path.join(save_dir, f) for _, f in found[:n]]


def average(paths):
    """The newest state (paths[0]) with "model" = mean of the models of `paths`."""
    sums, newest = collections.OrderedDict(), None
    for path in paths:
        checkpoint_io.require_file(path)  # fairseq's loader would raise a bare FileNotFoundError
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        if newest is None:
            newest = state
        model = state["model"]
        if sums and set(model) != set(sums):
            raise SystemExit(f"average_checkpoints.py: {path} has other parameters than {paths[0]}")
        for k, v in model.items():
            if k in sums:
                sums[k] += v.to(torch.float64) if v.is_floating_point() else 0
            else:
                sums[k] = v.to(torch.float64) if v.is_floating_point() else v.clone()
    ref = newest["model"]
    newest["model"] = collections.OrderedDict(
        (k, (s / len(paths)).to(ref[k].dtype) if ref[k].is_floating_point() else ref[k]) for k, s in sums.items())
    if OmegaConf.is_config(newest.get("cfg")):
        # fairseq's loader turned `cfg` into a DictConfig; store plain containers, as fairseq-train does
        # (Trainer.state_dict), so the average holds nothing a training checkpoint does not
        newest["cfg"] = OmegaConf.to_container(newest["cfg"], resolve=True, enum_to_str=True)
    return newest


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one directory")
    ap.add_argument("--output", required=True)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--num-update-checkpoints", type=int, help="the last N checkpoint_E_U.pt of the directory")
    g.add_argument("--num-epoch-checkpoints", type=int, help="the last N checkpointE.pt of the directory")
    args = ap.parse_args()

    if args.num_update_checkpoints or args.num_epoch_checkpoints:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            ap.error("--num-*-checkpoints takes one directory as --inputs")
        paths = last_checkpoints(args.inputs[0], args.num_update_checkpoints or args.num_epoch_checkpoints,
                                 by_update=bool(args.num_update_checkpoints))
    else:
        paths = args.inputs
    print("average_checkpoints.py: averaging " + " ".join(paths), flush=True)
    with checkpoint_io.exit_on_read_error("average_checkpoints.py"):  # one line, as fairseq-generate says it
        state = average(paths)
    checkpoint_utils.torch_persistent_save(state, args.output)
    print(f"average_checkpoints.py: wrote {args.output}")


if __name__ == "__main__":
    main()
