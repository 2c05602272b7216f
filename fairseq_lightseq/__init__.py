"""fairseq_lightseq: fused Transformer training for fairseq (`--user-dir fairseq_lightseq`).

Importing the package registers with fairseq the models `ls_transformer` and `ls_transformer_lm` (and
their architectures), the criteria `ls_label_smoothed_cross_entropy` and `ls_cross_entropy` and the
optimizer `ls_adam`, and allows the classes
fairseq checkpoints contain for torch's weights_only loading (checkpoint_safety).
"""
from .patches import requirements  # noqa: F401  (first: a clear error if fairseq 0.12 is missing)
from .patches import numpy_compat  # noqa: F401  (fairseq's np.compat.long under numpy 2)
from . import ops  # noqa: F401
from .checkpoints import safety  # noqa: F401
from .checkpoints import io  # noqa: F401  (clear errors for unreadable checkpoints, atomic copies)
from .patches import cli_config  # noqa: F401  (--bf16 without --tpu trains in bf16 on CUDA/CPU; --fp16 and torchrun on CPU)
from .patches import cpu_ddp  # noqa: F401  (--ddp-backend pytorch_ddp on CPU)
from .patches import clean_exit  # noqa: F401  (fairseq's data-buffer threads stopped before exit: no abort)
from . import criterions  # noqa: F401
from . import models  # noqa: F401
from . import optim  # noqa: F401

__version__ = "0.1.0"
