"""fairseq 0.12's TokenBlockDataset (every --sample-break-mode eos run of the language_modeling task, and
the LM hub interface's sample/score) and LanguagePairDataset.get_batch_shapes use `np.compat.long`,
which numpy 2 removed: with numpy >= 2 they stop with "module 'numpy' has no attribute 'compat'". Importing
the plugin restores exactly that name, as numpy 1.x defined it (`numpy.compat.long is int`), when it is
missing; nothing else of numpy is touched."""
import types

import numpy

from .wrap import replace


def install() -> None:
    """Adds numpy.compat (with `long`) where numpy lacks it (idempotent)."""
    if not hasattr(numpy, "compat"):
        replace(numpy, "compat", types.SimpleNamespace(long=int))
