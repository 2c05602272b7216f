#!/usr/bin/env python
"""Convert a fairseq checkpoint between `ls_transformer*` and fairseq's `transformer*`.

    python scripts/convert_checkpoint.py IN.pt OUT.pt --to fairseq    # ls_transformer_X -> transformer_X
    python scripts/convert_checkpoint.py IN.pt OUT.pt --to lightseq   # transformer_X -> ls_transformer_X

The two models have identical state_dicts (same keys, shapes and meaning), so only the recorded
model name and architecture change (`cfg.model._name`/`.arch`, and the old `args.arch`); model
weights, optimizer state, lr scheduler, dataloader position and everything else are kept as they
are. A converted checkpoint can be decoded or trained further with the other model
(`--restore-file`); to `lightseq` it needs `--user-dir fairseq_lightseq` as usual.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_lightseq import checkpoint_safety  # noqa: E402,F401  (torch.load of fairseq checkpoints)
from fairseq_lightseq.models.ls_transformer import ARCHITECTURES, check_supported  # noqa: E402

PREFIX = "ls_"


def convert_name(name: str, to: str) -> str:
    """ls_transformer_X <-> transformer_X; raises ValueError for a name with no counterpart."""
    if to == "fairseq":
        if name not in ARCHITECTURES:
            raise ValueError(f"{name!r} is not an ls_transformer architecture ({', '.join(ARCHITECTURES)})")
        return name[len(PREFIX):]
    if to == "lightseq":
        if PREFIX + name not in ARCHITECTURES:
            raise ValueError(f"fairseq architecture {name!r} has no ls_transformer counterpart "
                             f"({', '.join(a[len(PREFIX):] for a in ARCHITECTURES)})")
        return PREFIX + name
    raise ValueError(f"--to must be fairseq or lightseq, got {to!r}")


def _get(obj, key):
    return obj.get(key) if hasattr(obj, "get") and not isinstance(obj, argparse.Namespace) else getattr(obj, key, None)


def _set(obj, key, value):
    if isinstance(obj, argparse.Namespace):
        setattr(obj, key, value)
    else:
        obj[key] = value


def _convert_model_cfg(model_cfg, to: str) -> bool:
    """Rewrite `_name` and `arch` of a model config (Namespace, dict or DictConfig) in place."""
    changed = False
    for key in ("arch", "_name"):
        name = _get(model_cfg, key)
        if name is not None:
            _set(model_cfg, key, convert_name(name, to))
            changed = True
    if changed and to == "lightseq" and isinstance(model_cfg, argparse.Namespace):
        check_supported(model_cfg)  # fail now, not at the first fairseq-generate
    return changed


def convert_state(state: dict, to: str) -> dict:
    """Convert a loaded checkpoint dict in place and return it."""
    changed = False
    if state.get("args") is not None:
        changed |= _convert_model_cfg(state["args"], to)
    cfg = state.get("cfg")
    if cfg is not None and _get(cfg, "model") is not None:
        changed |= _convert_model_cfg(_get(cfg, "model"), to)
    if not changed:
        raise ValueError("checkpoint records no model architecture (no args.arch / cfg.model._name)")
    return state


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--to", required=True, choices=["fairseq", "lightseq"])
    args = parser.parse_args(argv)
    state = torch.load(args.input, map_location="cpu")  # weights_only (torch's default): safe
    convert_state(state, args.to)
    tmp = args.output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    print(f"wrote {args.output} ({args.to})")


if __name__ == "__main__":
    main()
