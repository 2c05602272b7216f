"""fairseq's `--task translation_from_pretrained_bart` with the plugin (patches.pretrained_bart_task): the task
set up from fairseq's own parser loads its data (each source ends with its language token), builds its
generator (which stops at the target's language token) and its inference dataset; without the patch
fairseq's task stops in load_dataset. --langs: a language of the pair the task uses (given, or inferred from
the data-bin's file names) outside --langs, no --langs or an empty name in it is refused naming the option
(a ConfigurationError: one line from fairseq's commands); spaces around the names are dropped."""
import re

import pytest
import torch

import fairseq_lightseq  # noqa: F401  (installs the patch)
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask
from fairseq_lightseq.errors import ConfigurationError

from support.cli import make_data_bin

TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("pretrained_bart")), n_train=20, n_valid=4, n_test=4)


PAIR = ("--source-lang", "src", "--target-lang", "tgt")


def setup(data_bin, *flags, arch="mbart_base", pair=PAIR):
    """(args, task) as fairseq-train sets them up for translation_from_pretrained_bart (src -> tgt: the
    data-bin's pair, given or, with pair=(), inferred by fairseq from its file names)."""
    argv = [data_bin, "--task", "translation_from_pretrained_bart", "--arch", arch, *pair, "--cpu", *TINY, *flags]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    return args, tasks.setup_task(args)


@pytest.mark.parametrize("arch", ["mbart_base", "ls_mbart_base"])
def test_task_loads_data_and_builds_its_generator(data_bin, arch):
    args, task = setup(data_bin, "--langs", "src,tgt", arch=arch)
    d = task.source_dictionary
    src_id, tgt_id = d.index("[src]"), d.index("[tgt]")
    assert src_id != d.unk() and tgt_id != d.unk() and d.index("<mask>") == len(d) - 1
    task.load_dataset("train")
    sample = task.dataset("train")[0]
    assert sample["source"][-1] == src_id  # append_source_id
    model = task.build_model(args)
    assert task.build_generator([model], args).eos == tgt_id
    assert task.build_dataset_for_inference([sample["source"][:-2]], [2])[0]["source"][-1] == src_id


def test_fairseq_fails_without_the_patch(data_bin, monkeypatch):
    """fairseq's own task, the patch's `args` removed: its load_dataset reads self.args."""
    _, task = setup(data_bin, "--langs", "src,tgt")
    monkeypatch.delattr(TranslationFromPretrainedBARTTask, "args")
    with pytest.raises(AttributeError, match="'TranslationFromPretrainedBARTTask' object has no attribute 'args'"):
        task.load_dataset("train")


@pytest.mark.parametrize("langs,pair,message", [
    ("src,de", PAIR, "--target-lang tgt is not in --langs src,de, so the dictionary has no language token [tgt]"),
    ("en,tgt", PAIR, "--source-lang src is not in --langs en,tgt"),
    ("en,de", (), "the source language src (taken from the data-bin's file names: no -s/--source-lang given) is "
                  "not in --langs en,de"),
    ("src,de", (), "the target language tgt (taken from the data-bin's file names: no -t/--target-lang given)"),
    ("src,,tgt", PAIR, "--langs 'src,,tgt' has an empty language name"),
    ("src,tgt,", (), "--langs 'src,tgt,' has an empty language name"),
    (None, PAIR, "needs --langs"),
])
def test_language_without_its_token_is_refused(data_bin, langs, pair, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        setup(data_bin, *(["--langs", langs] if langs else []), pair=pair)


def test_the_inferred_pair_is_used_when_listed(data_bin):
    args, task = setup(data_bin, "--langs", "tgt,src", pair=())
    d = task.source_dictionary
    assert (args.source_lang, args.target_lang) == ("src", "tgt")
    assert task.build_generator([task.build_model(args)], args).eos == d.index("[tgt]") != d.unk()


def test_spaces_around_the_languages_are_dropped(data_bin):
    """fairseq splits on "," only ([ tgt] at the position of [tgt]); the stripped names give the same rows,
    found by name, and the options (which a checkpoint records) keep the stripped list."""
    args, task = setup(data_bin, "--langs", " src , tgt")
    d = task.source_dictionary
    assert args.langs == "src,tgt" and task.langs == ["src", "tgt"]
    assert d.index("[src]") == len(d) - 3 and d.index("[tgt]") == len(d) - 2
    assert task.build_generator([task.build_model(args)], args).eos == d.index("[tgt]")


@pytest.fixture(scope="module")
def checkpoint_dir(data_bin, tmp_path_factory):
    """A folder with model.pt: a tiny ls_mbart_base of the task src -> tgt with --langs src,tgt (its options
    recorded as fairseq-train records them)."""
    args, task = setup(data_bin, "--langs", "src,tgt", arch="ls_mbart_base")
    folder = tmp_path_factory.mktemp("hub")
    torch.save({"cfg": convert_namespace_to_omegaconf(args), "model": task.build_model(args).state_dict(),
                "extra_state": {}, "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                                          "best_loss": None}]}, folder / "model.pt")
    return str(folder)


def test_the_hub_checks_the_pair_it_loads(data_bin, checkpoint_dir):
    """BARTModel.from_pretrained sets the task up from the checkpoint's options and the caller's: the
    recorded pair against a --langs given there, and the pair inferred from the data-bin without one."""
    from fairseq.models.bart import BARTModel

    hub = BARTModel.from_pretrained(checkpoint_dir, "model.pt", data_bin, bpe="characters")
    assert hub.task.build_generator(hub.models, hub.cfg.generation).eos == hub.task.tgt_dict.index("[tgt]")
    with pytest.raises(ConfigurationError, match=re.escape("--target-lang tgt is not in --langs src,de")):
        BARTModel.from_pretrained(checkpoint_dir, "model.pt", data_bin, bpe="characters", langs="src,de")
    with pytest.raises(ConfigurationError, match=re.escape("the target language tgt (taken from the data-bin's")):
        BARTModel.from_pretrained(checkpoint_dir, "model.pt", data_bin, bpe="characters", langs="src,de",
                                  source_lang=None, target_lang=None)
