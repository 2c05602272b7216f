"""Let torch >= 2.6's safe loader (`torch.load(..., weights_only=True)`, the default) read fairseq
checkpoints, without environment variables and without turning weights_only off.

fairseq's `checkpoint_utils.load_checkpoint_to_cpu` calls `torch.load(f)` with the default, which
refuses any pickled global outside torch's allowlist. fairseq checkpoints hold, besides tensors and
plain containers, exactly these (found with `torch.serialization.get_unsafe_globals_in_checkpoint`
on checkpoints written by fairseq-train, legacy `args` and hydra `cfg`):

* `argparse.Namespace`: `args` of old checkpoints and `cfg.model` of legacy (argparse) models;
* omegaconf's `DictConfig`/`ListConfig`, their `Metadata`/`ContainerMetadata` and value nodes, with
  `typing.Any`, `builtins.dict/list/int/float/str/bool` (container key/element types recorded in the
  metadata): `cfg` of checkpoints written before fairseq converted it to plain containers;
* `collections.defaultdict` (meters and iterator state in `extra_state`).

None of them runs code when unpickled (they are rebuilt by `__setstate__` from plain data), so the
loader stays safe: anything else (a custom class, `os.system` in a reduce) is still refused with
torch's UnpicklingError naming the global.
"""
import argparse
import collections
import typing

import torch

SAFE_GLOBALS = [argparse.Namespace, collections.defaultdict, typing.Any, dict, list, int, float, str, bool]

try:
    from omegaconf import DictConfig, ListConfig
    from omegaconf import base as _oc_base
    from omegaconf import nodes as _oc_nodes

    SAFE_GLOBALS += [DictConfig, ListConfig, _oc_base.Metadata, _oc_base.ContainerMetadata,
                     _oc_nodes.AnyNode, _oc_nodes.StringNode, _oc_nodes.IntegerNode, _oc_nodes.FloatNode,
                     _oc_nodes.BooleanNode, _oc_nodes.BytesNode, _oc_nodes.PathNode]
except ImportError:  # omegaconf comes with fairseq; without it there is no cfg to read
    pass


def register() -> None:
    """Add SAFE_GLOBALS to torch's weights_only allowlist (idempotent; no-op on old torch)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(SAFE_GLOBALS)


register()
