"""The plugin's refusals: the errors it raises when it refuses a configuration (an option, or a combination of
options, checked when the task, model, criterion or optimizer is built) or a file (an unreadable checkpoint).

Each message names the option or the file and says what to do, in one line, so that is all a user needs to
read: fairseq's commands end on a refusal with that line on stderr and exit status 1, without a traceback
(patches/refusal_exit.py). Every refusal is a `Refusal`; `ConfigurationError` is also a ValueError (what
Python code that validates values raises), checkpoints.io.CheckpointReadError also a RuntimeError.
"""

__all__ = ["ConfigurationError", "Refusal"]


class Refusal(Exception):
    """A configuration or a file the plugin refuses; the message (one line) names it and the remedy."""


class ConfigurationError(Refusal, ValueError):
    """An option value, or a combination of options, that the plugin does not run; the message names the
    option(s)."""
