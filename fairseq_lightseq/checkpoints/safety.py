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
* `collections.defaultdict` (meters and iterator state in `extra_state`);
* numpy numeric arrays and scalars (`numpy_globals`): with `--eval-bleu`, fairseq's translation task
  logs BLEU's n-gram counts and totals as numpy int64 arrays into the validation meters, which every
  checkpoint keeps in `extra_state["metrics"]` (scalars: a metric or best score computed with numpy);
* `fairseq.distributed.utils._TensorPlaceholder` (a frozen dataclass holding an int): when a
  multi-process run resumes, rank 0 loads the checkpoint and broadcasts it to the other ranks with the
  tensors replaced by these placeholders, which the other ranks unpickle with torch.load's default.

None of them runs code when unpickled (they are rebuilt by `__setstate__` from plain data), so the
loader stays safe: anything else (a custom class, `os.system` in a reduce, a numpy array of Python
objects) is still refused with torch's UnpicklingError naming the global or the type.
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


def numpy_globals():
    """What a pickled numpy scalar or array of a numeric dtype (bool, integers, floats, complex)
    refers to: the functions `_reconstruct` (array) and `scalar` (under numpy 2's module name and
    numpy 1's, so that checkpoints written with either load), `ndarray` and `dtype`, and the class of
    each numeric dtype, which torch's loader must know to restore a dtype's state. The object, void
    (structured), string and datetime dtypes are not listed: an array or scalar of them is refused,
    since an object array would rebuild arbitrary pickled objects."""
    try:
        import numpy as np
    except ImportError:  # without numpy, no checkpoint holds numpy values
        return []
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    found = [np.ndarray, np.dtype]
    for name in ("_reconstruct", "scalar"):
        fn = getattr(multiarray, name)
        found += [(fn, f"{module}.{name}") for module in ("numpy._core.multiarray", "numpy.core.multiarray")]
    numeric = "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]
    found += sorted({type(np.dtype(code)) for code in numeric}, key=lambda t: t.__name__)
    return found


SAFE_GLOBALS += numpy_globals()

try:
    from fairseq.distributed.utils import _TensorPlaceholder

    SAFE_GLOBALS.append(_TensorPlaceholder)
except ImportError:  # a fairseq without it broadcasts checkpoints another way
    pass


def register() -> None:
    """Add SAFE_GLOBALS to torch's weights_only allowlist (idempotent; no-op on old torch)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(SAFE_GLOBALS)

