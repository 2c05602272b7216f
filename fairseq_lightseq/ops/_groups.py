"""Finds the op groups of the ops package and exports their public names.

An op group is the unit docs/adding_an_op.md adds: one file per layer, named after the group
(ops/reference/layer_norm.py, csrc/kernels/layer_norm.h, csrc/cpu/layer_norm.cpp, csrc/ops/layer_norm.cpp,
ops/layer_norm.py, tests/ops/test_layer_norm.py). In Python, an op group is a module of `ops` whose
name has a spec of the same name in `ops/reference/`; it lists its public names in `__all__` (its ops,
and a type an op takes such as AttentionCoords), and the package exports them. A new op group is a new
pair of modules: no list of groups to edit. The other public module of `ops`, `dropout_stream`, has no
spec and is not an op group.
"""
import importlib
import pkgutil
from types import ModuleType
from typing import Dict, List

SPEC = "reference"  # the subpackage holding the spec of every op group


def public_modules(package: ModuleType) -> List[ModuleType]:
    """The modules of `package` (not its subpackages) whose name does not start with "_", imported, in
    name order."""
    return [importlib.import_module(f"{package.__name__}.{info.name}")
            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name)
            if not info.ispkg and not info.name.startswith("_")]


def op_group_modules(package: ModuleType) -> List[ModuleType]:
    """The op-group modules of the ops package `package`: its public modules with a spec in
    `package.reference`."""
    spec = importlib.import_module(f"{package.__name__}.{SPEC}")
    specs = {info.name for info in pkgutil.iter_modules(spec.__path__)}
    return [m for m in public_modules(package) if m.__name__.rsplit(".", 1)[1] in specs]


def export_all(package: ModuleType, modules: List[ModuleType]) -> Dict[str, object]:
    """Sets each of `modules`' `__all__` names on `package` and returns them ({name: object}). A module
    without `__all__`, or a name two modules export, is an error."""
    exported, owner = {}, {}
    for module in modules:
        names = getattr(module, "__all__", None)
        if names is None:
            raise ImportError(f"{module.__name__} must list its public names in __all__")
        for name in names:
            if name in owner:
                raise ImportError(f"{package.__name__}.{name} is exported by both {owner[name]} and {module.__name__}")
            owner[name] = module.__name__
            exported[name] = getattr(module, name)
    for name, obj in exported.items():  # after every import: a function may share a module's name (dropout)
        setattr(package, name, obj)
    return exported
