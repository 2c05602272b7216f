"""The one way the patches change fairseq, torch or numpy: an attribute of one of their modules (or of a
class of one) replaced once, and recorded.

`wrap(owner, name, make)` puts `make(original)` in place of the function `owner.name` (owner: a module, or
a class whose method fairseq calls through its instances; the replacement keeps the original's docstring
and holds it in `_fls_wrapped`); `replace(owner, name, value)` puts `value` (a subclass of the class there,
or a name the module lacks) in place. Both are idempotent: a second install finds its own replacement and
leaves it. `PATCHED` lists what was replaced, as ("module.name" or "module.Class.name", original or None),
for the layout test and for a reader asking what the plugin touches.
"""
from typing import Callable, Dict, Optional

WRAPPED = "_fls_wrapped"

# "owner module.name" -> the object it replaced (None where the name was missing)
PATCHED: Dict[str, Optional[object]] = {}


def _key(owner, name: str) -> str:
    """"module.name", or "module.Class.name" for an attribute of a class."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}.{name}"
    return f"{owner.__name__}.{name}"


def wrap(owner, name: str, make: Callable[[Callable], Callable]) -> Callable:
    """owner.name = make(owner.name) unless it is already a replacement; returns what is in place."""
    original = getattr(owner, name)
    if hasattr(original, WRAPPED):
        return original
    replacement = make(original)
    replacement.__doc__ = original.__doc__
    setattr(replacement, WRAPPED, original)
    setattr(owner, name, replacement)
    PATCHED[_key(owner, name)] = original
    return replacement


def replace(owner, name: str, value) -> None:
    """owner.name = value (idempotent: a second call with the same value changes nothing)."""
    current = getattr(owner, name, None)
    if current is value:
        return
    setattr(owner, name, value)
    PATCHED[_key(owner, name)] = current
