"""fairseq_lightseq/models/families.py: every family's ls_<arch> is registered for its model with exactly the
defaults of fairseq's <arch>, and the name lookups the checkpoint converter relies on."""
import argparse

import pytest

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq_lightseq.models.families import FAMILIES, family_of

# fairseq's plain transformer_lm has no arch function (its dataclass's defaults; test_lm_model checks ours)
NO_ARCH_FUNCTION = {"ls_transformer_lm"}
ARCHS = [(f, a) for f, family in FAMILIES.items() for a in family.architectures if a not in NO_ARCH_FUNCTION]


@pytest.mark.parametrize("family,ls_arch", ARCHS, ids=[a for _, a in ARCHS])
def test_architectures_registered_with_fairseq_defaults(family, ls_arch):
    f = FAMILIES[family]
    assert ARCH_MODEL_REGISTRY[ls_arch] is MODEL_REGISTRY[f.model]
    assert ARCH_MODEL_REGISTRY[ls_arch[3:]] is MODEL_REGISTRY[f.native]
    ours, theirs = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY[ls_arch](ours)
    ARCH_CONFIG_REGISTRY[ls_arch[3:]](theirs)
    assert vars(ours) == vars(theirs)


def test_family_of_finds_both_names_and_refuses_others():
    assert family_of("ls_transformer_lm_gpt").task == "language_modeling"
    assert family_of("transformer_wmt_en_de").model == "ls_transformer"
    with pytest.raises(ValueError, match="transformer_lm_wiki103"):
        family_of("transformer_lm_wiki103")
