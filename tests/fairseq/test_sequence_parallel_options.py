"""--sequence-parallel-size / --sequence-parallel-mode: every refused combination fails when the model is
built, with a message naming the option; P = 1 and single-process tools run unsharded."""
import argparse

import pytest

from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from fairseq_lightseq.sequence_parallel import options
from support.models import TINY, make_task

OK = dict(sequence_parallel_size=2, sequence_parallel_mode="ulysses", distributed_world_size=4,
          encoder_attention_heads=4, decoder_attention_heads=4, criterion="ls_label_smoothed_cross_entropy",
          ddp_backend="legacy_ddp")


def _args(**overrides):
    return argparse.Namespace(**{**OK, **overrides})


def test_accepted():
    options.check(_args())
    options.check(_args(sequence_parallel_mode="allgather", encoder_attention_heads=3, decoder_attention_heads=5))
    options.check(argparse.Namespace())  # a checkpoint from before the options: P = 1


@pytest.mark.parametrize("overrides,message", [
    (dict(sequence_parallel_size=0), "--sequence-parallel-size must be >= 1"),
    (dict(sequence_parallel_mode="ring"), "--sequence-parallel-mode must be one of ulysses, allgather"),
    (dict(distributed_world_size=3), "--sequence-parallel-size 2 must divide the number of processes "
                                     "(--distributed-world-size 3)"),
    (dict(encoder_attention_heads=3), "needs --encoder-attention-heads (3) divisible by --sequence-parallel-size "
                                      "(2); use --sequence-parallel-mode allgather"),
    (dict(decoder_attention_heads=6, sequence_parallel_size=4), "needs --decoder-attention-heads (6) divisible"),
    (dict(criterion="label_smoothed_cross_entropy"), "does not support --criterion label_smoothed_cross_entropy "
                                                     "(it needs --criterion ls_label_smoothed_cross_entropy or "
                                                     "ls_cross_entropy)"),
    (dict(ddp_backend="fully_sharded"), "does not support --ddp-backend fully_sharded"),
    (dict(ddp_backend="slowmo"), "does not support --ddp-backend slowmo"),
    (dict(use_bmuf=True), "does not support --use-bmuf"),
    (dict(model_parallel_size=2), "does not support --model-parallel-size 2"),
    (dict(tpu=True), "does not support --tpu"),
    (dict(eval_bleu=True), "does not support --eval-bleu"),
    (dict(ignore_prefix_size=1), "does not support --ignore-prefix-size 1"),
])
def test_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        options.check(_args(**overrides))
    assert message in str(e.value)


@pytest.mark.parametrize("mode", ["ulysses", "allgather"])
def test_a_size_that_does_not_divide_the_world_is_refused_first(mode):
    """P = 3 on 2 processes, with 4 heads (not divisible by 3) and a criterion SP refuses: the world size is
    what the user must change, whatever the mode (allgather, which takes any head count, would not run)."""
    with pytest.raises(ValueError) as e:
        options.check(_args(sequence_parallel_size=3, distributed_world_size=2, sequence_parallel_mode=mode,
                            criterion="label_smoothed_cross_entropy"))
    assert str(e.value) == ("--sequence-parallel-size 3 must divide the number of processes "
                            "(--distributed-world-size 2)")


def _lm(**overrides):
    from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel
    from support.lm import build_lm

    return build_lm(LSTransformerLanguageModel, make_task(), **{"criterion": "ls_cross_entropy", **overrides})


def _translation(**overrides):
    return LSTransformerModel.build_model(argparse.Namespace(**TINY, **overrides), make_task())


@pytest.mark.parametrize("build", [_translation, _lm], ids=["translation", "lm"])
def test_build_model_refuses_and_runs_unsharded_without_distributed(build):
    with pytest.raises(ValueError, match="--sequence-parallel-size 2 must divide"):
        build(sequence_parallel_size=2)
    with pytest.raises(ValueError, match="does not support --criterion cross_entropy"):
        build(sequence_parallel_size=2, distributed_world_size=2, criterion="cross_entropy")
    # fairseq-generate / fairseq-eval-lm on an SP checkpoint: the recorded options pass,
    # torch.distributed is not initialised
    model = build(sequence_parallel_size=2, distributed_world_size=2)
    assert all(getattr(m, "sequence_parallel", None) is None for m in (getattr(model, "encoder", None),
                                                                          model.decoder) if m is not None)


def _build_as_torchrun_records(family):
    """Builds the model in a 2-rank SP run whose namespace says 1 process (what fairseq records under
    torchrun); returns the world size the built model's args then record."""
    from support.lm import lm_args
    from fairseq_lightseq.models.families import FAMILIES
    from fairseq.models import MODEL_REGISTRY

    if family == "lm":
        args = lm_args("transformer_lm_gpt2_tiny", decoder_layers=1, criterion="ls_cross_entropy")
    else:
        args = argparse.Namespace(**TINY, decoder_embed_dim=16)
    args.sequence_parallel_size, args.distributed_world_size = 2, 1
    name = FAMILIES["language_model" if family == "lm" else "translation"].model
    task = make_task()
    task.get_batch_iterator = lambda **kwargs: None  # what setup() shards
    MODEL_REGISTRY[name].build_model(args, task)
    return args.distributed_world_size


@pytest.mark.parametrize("family", ["translation", "lm"])
def test_checkpoint_of_a_torchrun_run_records_the_world(family):
    """A one-process tool (fairseq-eval-lm, fairseq-generate) loads the checkpoint of an SP run started
    by torchrun: the model's recorded args name the real number of processes."""
    from support.dist import run

    assert run(_build_as_torchrun_records, 2, family) == [2, 2]


def test_lm_checks_the_decoder_heads_only():
    """ulysses splits the decoder's heads; the language model has no encoder, so --encoder-attention-heads
    (set by none of the transformer_lm archs) is not read."""
    with pytest.raises(ValueError, match=r"needs --decoder-attention-heads \(6\) divisible by "
                                         r"--sequence-parallel-size \(4\)"):
        _lm(sequence_parallel_size=4, distributed_world_size=4, decoder_attention_heads=6, decoder_embed_dim=18)
    _lm(sequence_parallel_size=4, distributed_world_size=4, decoder_attention_heads=6, decoder_embed_dim=18,
        sequence_parallel_mode="allgather")
    _lm(sequence_parallel_size=2, distributed_world_size=4, encoder_attention_heads=3)
