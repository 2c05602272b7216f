"""fairseq model registrations (`--arch ls_transformer*`, `--arch ls_transformer_lm*`, `--arch ls_roberta*`)."""
from . import ls_roberta  # noqa: F401
from . import ls_transformer  # noqa: F401
from . import ls_transformer_lm  # noqa: F401
