"""The fused ops as differentiable functions (autograd.Function over torch.ops.fairseq_lightseq.*),
falling back to the reference ops (`fairseq_lightseq.ops.reference`) where no kernel is built.

Each family module (`layer_norm.py`, `attention.py`, ...) lists its public names in `__all__`; this
package exports them all (FAMILY_EXPORTS), so adding a family adds no line here."""
import sys

from . import reference  # noqa: F401
from . import blocks  # noqa: F401
from ._backend import BUILD_INFO, NO_DROPOUT, Dropout, draw, has_kernel  # noqa: F401
from .reference.attention import AttentionCoords  # noqa: F401  (the coords type the attention op takes)
from . import _groups

# {public name: object}, from every family module's __all__
FAMILY_EXPORTS = _groups.export_families(sys.modules[__name__])
