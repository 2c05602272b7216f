"""fairseq's commands end on one of the plugin's refusals (errors.Refusal: an option it does not run, an
unreadable checkpoint) with its one-line message on stderr and exit status 1, instead of a traceback.

Where: the refusal is raised inside fairseq's `main` (model, criterion or optimizer build, checkpoint
loading, where fairseq may re-raise it as an exception of its own: the refusal is then that one's context),
whose caller, the console script, the plugin cannot wrap. What every such process does
with an exception nobody caught is `sys.excepthook`, so that is what is replaced: for a refusal it
writes `PROG: error: MESSAGE` (PROG the command's name, as argparse and `python -m
fairseq_lightseq.export_ctranslate2` write theirs) and Python then exits 1, as for any uncaught
exception; every other exception goes to the hook that was there before (Python's traceback).

Ranks: each process of a run started by hand (`--distributed-no-spawn`) or by torchrun runs the hook
itself (torch.distributed's init_process_group puts a hook in front that writes `[rankR]: ` before each
line). fairseq's own spawn (`torch.multiprocessing.spawn`, GPU runs without either) re-raises a rank's
exception in the parent as ProcessRaisedException holding the rank's traceback as text; when the last
line of that text is a refusal, the parent writes its message the same way. (torchrun's launcher is a
process of its own, without the plugin: it still reports the failed worker in its own summary.)
"""
import os
import sys
from typing import Optional

from torch.multiprocessing import ProcessRaisedException

from ..errors import Refusal
from .wrap import replace

# set on the hook function; its value is the hook it replaced
PREVIOUS = "_fls_previous_hook"


def _refusal_names():
    """{qualified name as a traceback prints it: class} of Refusal and its subclasses."""
    found, stack = {}, [Refusal]
    while stack:
        cls = stack.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        stack.extend(cls.__subclasses__())
    return found


def refusal_message(exc: BaseException) -> Optional[str]:
    """The message of `exc` when it is a refusal, raised in this process (also where fairseq re-raised it as
    another exception: trainer.load_checkpoint turns whatever the model's load_state_dict raised into
    "Cannot load model parameters from checkpoint ...", with the refusal as its context) or in a rank that
    torch.multiprocessing.spawn started (its ProcessRaisedException); else None."""
    seen = exc
    while seen is not None:
        if isinstance(seen, Refusal):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    if not isinstance(exc, ProcessRaisedException):
        return None
    lines = [line for line in str(exc).splitlines() if line.strip()]
    name, sep, message = (lines[-1] if lines else "").partition(": ")
    return message if sep and name in _refusal_names() else None


def excepthook(exc_type, exc, tb):
    """sys.excepthook with the plugin: `PROG: error: MESSAGE` for a refusal (refusal_message), the previous
    hook's output for anything else."""
    message = refusal_message(exc)
    if message is None:
        return getattr(excepthook, PREVIOUS)(exc_type, exc, tb)
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()


def install() -> None:
    """Puts `excepthook` in sys.excepthook, keeping the one there for everything else (idempotent: once
    installed, a hook put in place since, such as torch.distributed's rank prefix, calls this one)."""
    if hasattr(excepthook, PREVIOUS):
        return
    setattr(excepthook, PREVIOUS, sys.excepthook)
    replace(sys, "excepthook", excepthook)
