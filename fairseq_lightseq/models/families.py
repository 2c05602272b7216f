"""The model families fairseq_lightseq implements, each next to fairseq's own: one table that the
checkpoint converter (checkpoints/convert.py, behind scripts/convert_checkpoint.py) and the benchmarks
read, so that a new family is one entry here (plus its model and criterion files), not a branch in
every script.

A family pairs our registered model with fairseq's (same state_dict, same arch functions), and
CRITERIA pairs our criteria with fairseq's (same options and logging). The optimizer pair is the
same for every family: fairseq's adam and our ls_adam.
"""
from typing import Callable, Dict, NamedTuple, Optional

from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.criterions.masked_lm import MaskedLmLoss
from fairseq.models.transformer_lm import TransformerLanguageModelConfig
from fairseq.optim.adam import FairseqAdam

from ..criterions.ls_cross_entropy import LsCrossEntropyCriterion
from ..criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
from ..criterions.ls_masked_lm import LsMaskedLmLoss
from . import ls_bart, ls_roberta, ls_transformer, ls_transformer_lm
from .common import check_supported
from ..optim.ls_adam import LSAdam

PREFIX = "ls_"


class Family(NamedTuple):
    """task: the fairseq task it trains with; model / native: our and fairseq's registered model names;
    architectures: our arch names (ls_<fairseq arch>) -> fairseq's arch functions; criterion / native_criterion:
    the pair a user switches (the recipe's default); native_config: the dataclass fairseq registers its
    model with, if any (its checkpoints then record cfg.model as a plain dict of these fields, which
    torch's safe loader reads without any allowlist; ours, a legacy model, record an argparse Namespace);
    checker: the model's own option check, if it has more refusals than check_supported's."""

    task: str
    model: str
    native: str
    architectures: Dict[str, Callable]
    criterion: str
    native_criterion: str
    native_config: Optional[type] = None
    checker: Optional[Callable] = None

    def check(self, args) -> None:
        """Raise ValueError naming an option of `args` our model of this family does not implement."""
        if self.checker is not None:
            self.checker(args)
        else:
            check_supported(args, self.model, self.native)


FAMILIES = {
    "translation": Family("translation", "ls_transformer", "transformer", ls_transformer.ARCHITECTURES,
                          "ls_label_smoothed_cross_entropy", "label_smoothed_cross_entropy"),
    "language_model": Family("language_modeling", "ls_transformer_lm", "transformer_lm",
                             ls_transformer_lm.ARCHITECTURES, "ls_cross_entropy", "cross_entropy",
                             TransformerLanguageModelConfig),
    # pretraining; fine-tuning is fairseq's sentence_prediction task and criterion on the same model
    "masked_lm": Family("masked_lm", "ls_roberta", "roberta", ls_roberta.ARCHITECTURES, "ls_masked_lm",
                        "masked_lm", checker=ls_roberta.check),
    # BART / mBART: denoising pretraining (multilingual_denoising for mBART); fine-tuning is fairseq's
    # translation_from_pretrained_bart, translation or sentence_prediction task on the same model
    "bart": Family("denoising", "ls_bart", "bart", ls_bart.ARCHITECTURES, "ls_label_smoothed_cross_entropy",
                   "label_smoothed_cross_entropy", checker=ls_bart.check),
}

# (fairseq's registry name, ours), (fairseq's class name, ours) — the class names are what fairseq records
# in a checkpoint's optimizer_history and checks on --restore-file.
CRITERIA = [
    (("label_smoothed_cross_entropy", "ls_label_smoothed_cross_entropy"),
     (LabelSmoothedCrossEntropyCriterion.__name__, LsLabelSmoothedCrossEntropyCriterion.__name__)),
    (("cross_entropy", "ls_cross_entropy"), (CrossEntropyCriterion.__name__, LsCrossEntropyCriterion.__name__)),
    (("masked_lm", "ls_masked_lm"), (MaskedLmLoss.__name__, LsMaskedLmLoss.__name__)),
]
OPTIMIZERS = [(("adam", "ls_adam"), (FairseqAdam.__name__, LSAdam.__name__))]


def family_of(arch: str) -> Family:
    """The family whose architectures include `arch` (ours or fairseq's name); ValueError otherwise."""
    name = arch if arch.startswith(PREFIX) else PREFIX + arch
    for family in FAMILIES.values():
        if name in family.architectures:
            return family
    known = ", ".join(a for f in FAMILIES.values() for a in f.architectures)
    raise ValueError(f"{arch!r} is not an architecture of fairseq_lightseq or its fairseq counterpart ({known})")
