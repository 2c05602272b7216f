"""fairseq_lightseq: fused Transformer training for fairseq (`--user-dir fairseq_lightseq`)."""
from . import ops  # noqa: F401
from . import checkpoint_safety  # noqa: F401
from . import models  # noqa: F401

__version__ = "0.1.0"
