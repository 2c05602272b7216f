"""Finds the op families of a package: every module of it whose name does not start with "_" (one per
family, `layer_norm.py`, `attention.py`, ...) lists its public names in `__all__` (its ops, and a type
an op takes such as AttentionCoords), and the package exports them. A new family is a new module: no
list of families to edit."""
import importlib
import pkgutil
from types import ModuleType
from typing import Dict, List


def family_modules(package: ModuleType) -> List[ModuleType]:
    """The family modules of `package` (not its subpackages), imported, in name order."""
    return [importlib.import_module(f"{package.__name__}.{info.name}")
            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name)
            if not info.ispkg and not info.name.startswith("_")]


def export_families(package: ModuleType) -> Dict[str, object]:
    """Sets each family module's `__all__` names on `package` and returns them ({name: object}). A family
    module without `__all__`, or a name two families export, is an error."""
    exported, owner = {}, {}
    for module in family_modules(package):
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
