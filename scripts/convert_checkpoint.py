#!/usr/bin/env python
"""Convert a fairseq checkpoint between fairseq_lightseq's implementations and fairseq's own.

    python scripts/convert_checkpoint.py IN.pt OUT.pt --to lightseq   # fairseq's -> ls_*
    python scripts/convert_checkpoint.py IN.pt OUT.pt --to fairseq    # ls_* -> fairseq's

Our models, criteria and optimizer share their state exactly with fairseq's (the pairs are listed in
fairseq_lightseq/families.py), so only the names a checkpoint records change; model weights, optimizer state (Adam's step/exp_avg/exp_avg_sq per parameter, in the same
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
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_lightseq import checkpoint_io, checkpoint_safety  # noqa: E402,F401  (safe torch.load, clear read errors)
from fairseq_lightseq.families import CRITERIA, OPTIMIZERS, PREFIX, family_of  # noqa: E402

PARTS = ("model", "criterion", "optimizer")
# Config fields ls_adam has and fairseq's adam has not (ls_adam only accepts their defaults).
LS_ADAM_ONLY = ("amsgrad",)


def convert_name(name: str, to: str) -> str:
    """ls_X <-> X for the architectures of every family; raises ValueError for a name with no counterpart."""
    if to not in ("fairseq", "lightseq"):
        raise ValueError(f"--to must be fairseq or lightseq, got {to!r}")
    if name.startswith(PREFIX) != (to == "fairseq"):
        side = "a fairseq_lightseq" if to == "fairseq" else "a fairseq"
        raise ValueError(f"{name!r} is not {side} architecture (converting --to {to})")
    family_of(name)  # raises for a name outside every family
    return name[len(PREFIX):] if to == "fairseq" else PREFIX + name


def _swap(name, pairs, to: str):
    """The counterpart of `name` among `pairs` [(fairseq's, ours)] for direction `to`; other names unchanged."""
    for pair in pairs:
        src, dst = pair if to == "lightseq" else pair[::-1]
        if name == src:
            return dst
    return name


def _get(obj, key):
    return obj.get(key) if hasattr(obj, "get") and not isinstance(obj, argparse.Namespace) else getattr(obj, key, None)


def _set(obj, key, value):
    if isinstance(obj, argparse.Namespace):
        setattr(obj, key, value)
    else:
        obj[key] = value


def _rename(obj, key, pairs, to: str, changes: list) -> None:
    """obj[key] (or obj.key) -> its counterpart among pairs, when obj records it."""
    old = _get(obj, key) if obj is not None else None
    if isinstance(old, str):
        new = _swap(old, pairs, to)
        if new != old:
            _set(obj, key, new)
            changes.append(f"{key} {old} -> {new}")


def _convert_model_cfg(model_cfg, to: str) -> bool:
    """Rewrite `_name` and `arch` of a model config (Namespace, dict or DictConfig) in place."""
    changed = None
    for key in ("arch", "_name"):
        name = _get(model_cfg, key)
        if name is not None:
            changed = convert_name(name, to)
            _set(model_cfg, key, changed)
    if changed and to == "lightseq":
        # fail now, not at the first fairseq-generate (a dataclass model's config is saved as a dict)
        family_of(changed).check(model_cfg if isinstance(model_cfg, argparse.Namespace)
                                 else argparse.Namespace(**model_cfg))
    return changed is not None


def _native_model_cfg(model_cfg):
    """A legacy (Namespace) model config as the native model of its family records it: for fairseq's
    dataclass models (transformer_lm) a dict of the dataclass's fields with `_name` the arch, which a
    vanilla fairseq loads with torch's safe loader and nothing imported; otherwise unchanged."""
    if not isinstance(model_cfg, argparse.Namespace):
        return model_cfg
    config = family_of(model_cfg.arch).native_config
    if config is None:
        return model_cfg
    fields = [f.name for f in dataclasses.fields(config)]
    return {"_name": model_cfg.arch, **{k: getattr(model_cfg, k) for k in fields if hasattr(model_cfg, k)}}


def _drop_ls_adam_fields(optimizer_cfg) -> None:
    """fairseq's adam config has no `amsgrad` field (ls_adam's only accepts False): drop it."""
    for key in LS_ADAM_ONLY:
        if isinstance(optimizer_cfg, argparse.Namespace):
            optimizer_cfg.__dict__.pop(key, None)
        elif optimizer_cfg is not None and key in optimizer_cfg:
            del optimizer_cfg[key]


def convert_state(state: dict, to: str, parts=PARTS) -> list:
    """Convert a loaded checkpoint dict in place; returns the changes made (strings).
    Raises ValueError when the model is to be converted and the checkpoint records no architecture."""
    changes = []
    cfg = state.get("cfg")
    args = state.get("args")
    model_cfg = _get(cfg, "model") if cfg is not None else None
    if "model" in parts:
        changed = False
        for m in (args, model_cfg):
            if m is not None:
                old = _get(m, "arch") or _get(m, "_name")
                if _convert_model_cfg(m, to):
                    changed = True
                    changes.append(f"arch {old} -> {_get(m, 'arch') or _get(m, '_name')}")
        if not changed:
            raise ValueError("checkpoint records no model architecture (no args.arch / cfg.model._name)")
        if to == "fairseq" and model_cfg is not None:
            cfg["model"] = model_cfg = _native_model_cfg(model_cfg)
    for part, pairs in (("criterion", CRITERIA), ("optimizer", OPTIMIZERS)):
        if part not in parts:
            continue
        names, classes = [p[0] for p in pairs], [p[1] for p in pairs]
        section = _get(cfg, part) if cfg is not None else None
        for obj, key in ((args, part), (model_cfg, part), (section, "_name")):
            _rename(obj, key, names, to, changes)
        for entry in state.get("optimizer_history") or []:
            _rename(entry, f"{part}_name", classes, to, changes)
        if part == "optimizer" and to == "fairseq" and _get(section, "_name") == "adam":
            _drop_ls_adam_fields(section)
    return changes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--to", required=True, choices=["fairseq", "lightseq"])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to convert (default: all three)")
    args = parser.parse_args(argv)
    with checkpoint_io.exit_on_read_error("convert_checkpoint.py"):  # one line, as fairseq-generate says it
        state = checkpoint_io.load_file(args.input)  # weights_only (torch's default): safe
    changes = convert_state(state, args.to, args.parts)
    tmp = args.output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    print(f"wrote {args.output} ({args.to}): " + "; ".join(dict.fromkeys(changes)))


if __name__ == "__main__":
    main()
