"""Rewriting the names a checkpoint records, between our implementations and fairseq's: the code behind
`scripts/convert_checkpoint.py` (whose docstring lists what changes and why) and
`python -m fairseq_lightseq.export_ctranslate2`, kept in the package so that both call one copy.
"""
import argparse
import dataclasses

from ..models.families import CRITERIA, OPTIMIZERS, PREFIX, family_of

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


def recorded_arch(state: dict):
    """The architecture a loaded checkpoint records (`args.arch`, else `cfg.model`'s arch or _name), or None."""
    cfg = state.get("cfg")
    for m in (state.get("args"), _get(cfg, "model") if cfg is not None else None):
        if m is not None and (_get(m, "arch") or _get(m, "_name")):
            return _get(m, "arch") or _get(m, "_name")
    return None


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
