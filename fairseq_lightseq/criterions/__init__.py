"""fairseq criterions of fairseq_lightseq (registered on import)."""
from . import ls_cross_entropy  # noqa: F401
from . import ls_label_smoothed_cross_entropy  # noqa: F401
from . import ls_masked_lm  # noqa: F401
