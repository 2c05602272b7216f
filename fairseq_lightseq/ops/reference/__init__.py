"""The spec: every fused op written in plain PyTorch. Kernels are tested against these functions,
and they run whenever the compiled library (or its kernel for a device) is absent.

Each module lists its public names in `__all__`; this package exports them all."""
import sys

from .. import _groups

_groups.export_all(sys.modules[__name__], _groups.public_modules(sys.modules[__name__]))
