"""Every registered ls_* architecture (translation, language model, RoBERTa, BART/mBART) built as
fairseq-train builds it: fairseq's own parser (options.parse_args_and_arch with the family's --task), the task's build_model,
at a tiny width (1 layer, width 16: the arch functions yield to explicit options, so even
ls_transformer_lm_gpt3_175 is cheap). Each is compared with fairseq's native arch of the same name built
the same way: the same state_dict, value for value, after the same seed (fairseq's initialisation drawn
in fairseq's order), and on the native model's (perturbed) weights the same logits in eval mode (dropout
off) at every real position. This builds the namespace a user's command line gives, in
which an arch function may leave options unset (every named transformer_lm arch leaves
--activation-dropout unset: fairseq fills it from its model config's defaults)."""
import os

import pytest
import torch

from fairseq import options, tasks
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq_lightseq.models.families import FAMILIES, PREFIX, family_of

from support.cli import USER_DIR
from support.lm import lm_batch
from support.models import batch, make_dict, perturb_
from support.parity import rel_err
from support.roberta import mlm_batch

LS_ARCHS = sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith(PREFIX))
WIDTH = {  # per side: 1 layer, width 16, 2 heads, FFN 32
    side: [f"--{side}-layers", "1", f"--{side}-embed-dim", "16", f"--{side}-attention-heads", "2",
           f"--{side}-ffn-embed-dim", "32"] for side in ("encoder", "decoder")}
TASK_ARGS = {
    "translation": ["--source-lang", "src", "--target-lang", "tgt", *WIDTH["encoder"], *WIDTH["decoder"]],
    "language_modeling": WIDTH["decoder"],
    "masked_lm": WIDTH["encoder"],
    "denoising": [*WIDTH["encoder"], *WIDTH["decoder"]],  # BART's pretraining task
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The dictionaries each task's setup reads: dict.txt (language_modeling, masked_lm) and
    dict.src.txt / dict.tgt.txt (translation), the same 29 symbols."""
    d = tmp_path_factory.mktemp("dicts")
    words = make_dict(25)
    for name in ("dict.txt", "dict.src.txt", "dict.tgt.txt"):
        words.save(os.path.join(d, name))
    return str(d)


def build(data_dir, arch, seed=1):
    """(task, model) as fairseq-train builds them for --arch `arch` (with --user-dir) after seeding
    torch with `seed` (as fairseq-train's --seed), eval mode."""
    task_name = family_of(arch).task
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_dir, "--user-dir", USER_DIR, "--task", task_name,
                                                "--arch", arch, "--cpu", *TASK_ARGS[task_name]])
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    return task, task.build_model(args).eval()


def logits(model, task):
    """The model's logits at the real positions of a padded batch (pad positions are never read)."""
    with torch.no_grad():
        if hasattr(model, "encoder") and hasattr(model, "decoder"):  # translation, BART
            src, lens, prev = batch(task, B=3, S=7, T=6)
            out = model(src, lens, prev)[0]
            real = prev.ne(task.target_dictionary.pad())
        elif hasattr(model, "decoder"):  # language model
            tokens = lm_batch(task, B=3, T=9)[0]
            out, real = model(tokens)[0], tokens.ne(task.source_dictionary.pad())
        else:  # RoBERTa's masked-LM head
            tokens = mlm_batch(task, B=3, T=9)[0]
            out, real = model(tokens)[0], tokens.ne(task.source_dictionary.pad())
    return out * real.unsqueeze(-1)


def stacks(model):
    """The modules holding embed_tokens / embed_positions, for perturb_."""
    if hasattr(model, "encoder") and hasattr(model, "decoder"):
        return [model.encoder, model.decoder]
    if hasattr(model, "decoder"):
        return [model.decoder]
    return [model.encoder.sentence_encoder]


def test_every_family_arch_is_registered_and_nothing_else():
    listed = {a for family in FAMILIES.values() for a in family.architectures}
    assert set(LS_ARCHS) == listed
    assert any("gpt3_175" in a for a in LS_ARCHS)


@pytest.mark.parametrize("arch", LS_ARCHS)
def test_arch_builds_from_fairseq_parser_and_matches_native(data_dir, arch):
    task, ours = build(data_dir, arch)
    native_task, native = build(data_dir, arch[len(PREFIX):])
    assert isinstance(ours, type(native)) and type(ours) is not type(native)  # ours subclasses fairseq's
    theirs = native.state_dict()
    assert ours.state_dict().keys() == theirs.keys()
    # the same seed draws fairseq's initial weights (so fairseq-train --seed starts where fairseq does)
    unequal = [k for k, v in ours.state_dict().items() if not torch.equal(v, theirs[k])]
    assert not unequal, unequal
    perturb_(native, seed=0, stacks=stacks(native))
    ours.load_state_dict(native.state_dict(), strict=True)
    ref = logits(native, native_task)
    assert rel_err(logits(ours, task), ref) < 1e-5, arch
