"""fairseq_lightseq: fused Transformer training for fairseq (`--user-dir fairseq_lightseq`).

Importing the package applies the fixes to fairseq, torch and numpy the plugin needs (`patches`:
first the check for fairseq 0.12, then torch's safe loader allowed to read fairseq checkpoints and
the rest, in the order patches/__init__.py lists) and registers with fairseq, for each model family
(models/families.py):

* translation: the model `ls_transformer` (architectures `ls_transformer*`) and the criterion
  `ls_label_smoothed_cross_entropy`;
* decoder-only language model: the model `ls_transformer_lm` (`ls_transformer_lm*`) and the criterion
  `ls_cross_entropy`;
* RoBERTa: the model `ls_roberta` (`ls_roberta*`) and the criterion `ls_masked_lm`;

and the optimizer `ls_adam` for all three. Commands: `python -m fairseq_lightseq.info` (what was built),
`python -m fairseq_lightseq.export_ctranslate2` (a translation or language-model checkpoint for
CTranslate2), `python -m fairseq_lightseq.demo` (train, decode, score). The layers are drawn in
docs/architecture.md.
"""
__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)

from . import patches

patches.install()

from . import ops  # noqa: E402
from . import checkpoints  # noqa: E402
from . import criterions  # noqa: E402
from . import models  # noqa: E402
from . import optim  # noqa: E402

__all__ = ["__version__", "checkpoints", "criterions", "models", "ops", "optim", "patches"]
