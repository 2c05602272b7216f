"""The optimizer `--optimizer ls_adam` (ls_adam.py: fairseq's wrapper, registered with fairseq on import)
and the torch optimizer it drives (fused_adam.py)."""
from .fused_adam import FusedAdam  # noqa: F401
from .ls_adam import LSAdam, LSAdamConfig  # noqa: F401
