"""fairseq model registrations (`--arch ls_transformer*`)."""
from . import ls_transformer  # noqa: F401
