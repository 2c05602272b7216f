"""fairseq model registrations (`--arch ls_transformer*`, `--arch ls_transformer_lm*`, `--arch ls_roberta*`,
`--arch ls_bart*` / `ls_mbart*`)."""
from . import ls_bart  # noqa: F401
from . import ls_roberta  # noqa: F401
from . import ls_transformer  # noqa: F401
from . import ls_transformer_lm  # noqa: F401
