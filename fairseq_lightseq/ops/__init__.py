"""The fused ops as differentiable functions (autograd.Function over torch.ops.fairseq_lightseq.*),
falling back to the reference ops (`fairseq_lightseq.ops.reference`) where no kernel is built.

Each op group module (`layer_norm.py`, `attention.py`, ...; see _groups.py) lists its public names in
`__all__`; this package exports them all (OP_GROUP_EXPORTS), so adding an op group adds no line here.
Besides the op groups: `dropout_stream` (the draw every op with dropout takes), `blocks` (one autograd
node per Transformer sublayer, composing the ops), `reference` (the spec), and what the rest of the
plugin asks about the compiled library (BUILD_INFO, LOAD_ERROR, LIBRARY_FILE, NAMESPACE, has_kernel,
use_kernel, registered_ops) and about autocast (autocast_on).

Layering inside ops: reference <- _backend <- dropout_stream <- op groups <- blocks; nothing outside
this package imports a module or name of it that starts with "_"."""
import sys

from . import reference  # noqa: F401
from . import dropout_stream  # noqa: F401
from . import blocks  # noqa: F401
from ._backend import (BUILD_INFO, LIBRARY_FILE, LOAD_ERROR, NAMESPACE, autocast_on, emulated_cuda,  # noqa: F401
                       has_kernel, registered_ops, use_kernel)
from .dropout_stream import NO_DROPOUT, SITE_BITS, Dropout, draw, next_seed  # noqa: F401
from .reference.attention import AttentionCoords  # noqa: F401  (the coords type the attention op takes)
from . import _groups

# {public name: object}, from every op group module's __all__
OP_GROUP_EXPORTS = _groups.export_all(sys.modules[__name__], _groups.op_group_modules(sys.modules[__name__]))
