"""fairseq_lightseq/models/families.py: every family's ls_<arch> is registered for its model with exactly the
defaults of fairseq's <arch>, and the name lookups the checkpoint converter relies on. Every arch a model's
refusal names is one of fairseq's registry (with the plugin imported): a refused option of --arch ls_<arch>
names ls_<arch> and fairseq's <arch>."""
import argparse
import fnmatch
import re

import pytest

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq_lightseq.errors import ConfigurationError, Refusal
from fairseq_lightseq.models.families import FAMILIES, family_of
from fairseq_lightseq.models.ls_bart import check_encoder_decoder_state

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


EVERY_LS_ARCH = [a for family in FAMILIES.values() for a in family.architectures]


def refusal(check, args) -> str:
    with pytest.raises(ConfigurationError) as e:
        check(args)
    return str(e.value)


def arch_args(arch: str, **options) -> argparse.Namespace:
    """The namespace of --arch `arch` (its arch function applied) with `options` given first."""
    args = argparse.Namespace(arch=arch, **options)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def named_archs(message: str):
    """The arch names (or patterns, bart_*) a message gives after --arch: "--arch a for it", "--arch a / b",
    "(--arch a_*, b_*) is needed"."""
    for group in re.findall(r"--arch ([^;)]+)", message):
        yield from (n for n in re.split(r"[ ,/]+", group.removesuffix(" for it")) if n)


@pytest.mark.parametrize("ls_arch", EVERY_LS_ARCH)
def test_a_refused_option_names_the_arch_asked_for_and_fairseqs(ls_arch):
    message = refusal(family_of(ls_arch).check, arch_args(ls_arch, decoder_layerdrop=0.1))
    assert message == f"{ls_arch} does not support --decoder-layerdrop; use --arch {ls_arch[3:]} for it"


def refusal_messages():
    """Every refusal of an ls model that names an arch: an unsupported option under each ls arch and under
    none (a model built in code), ls_roberta's pruning options, another family's checkpoint for ls_bart."""
    for family in FAMILIES.values():
        yield refusal(family.check, argparse.Namespace(decoder_layerdrop=0.1))
        for arch in family.architectures:
            yield refusal(family.check, arch_args(arch, decoder_layerdrop=0.1))
    for arch in FAMILIES["masked_lm"].architectures:
        yield refusal(FAMILIES["masked_lm"].check, arch_args(arch, mha_heads_to_keep=2))
    for state in ({"encoder.sentence_encoder.x": 0}, {"decoder.x": 0}, {"encoder.x": 0}):
        with pytest.raises(Refusal) as e:  # one line and exit 1 from fairseq's commands, no traceback
            check_encoder_decoder_state(state)
        yield str(e.value)


def test_every_arch_a_refusal_names_is_registered():
    missing = [(name, message) for message in refusal_messages() for name in named_archs(message)
               if not fnmatch.filter(ARCH_MODEL_REGISTRY, name)]
    assert not missing, missing
    assert set(named_archs("x; use --arch a for it")) == {"a"}
    assert set(named_archs("(--arch b_*, c; --arch d / e) is")) == {"b_*", "c", "d", "e"}
