"""fairseq optimizers of fairseq_lightseq (registered with fairseq on import)."""
from .ls_adam import FusedAdam, LSAdam, LSAdamConfig  # noqa: F401
