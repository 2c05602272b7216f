"""fairseq's `--task translation_from_pretrained_bart` with the plugin (patches.pretrained_bart_task): the task
set up from fairseq's own parser loads its data (each source ends with its language token), builds its
generator (which stops at the target's language token) and its inference dataset; without the patch
fairseq's task stops in load_dataset; a language outside --langs, or no --langs, is refused naming the option."""
import pytest

import fairseq_lightseq  # noqa: F401  (installs the patch)
from fairseq import options, tasks
from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask

from support.cli import make_data_bin

TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("pretrained_bart")), n_train=20, n_valid=4, n_test=4)


def setup(data_bin, *flags, arch="mbart_base"):
    """(args, task) as fairseq-train sets them up for translation_from_pretrained_bart src -> tgt."""
    argv = [data_bin, "--task", "translation_from_pretrained_bart", "--arch", arch, "--source-lang", "src",
            "--target-lang", "tgt", "--cpu", *TINY, *flags]
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


@pytest.mark.parametrize("langs,message", [
    ("src,de", "--target-lang tgt is not in --langs src,de"),
    ("en,tgt", "--source-lang src is not in --langs en,tgt"),
    (None, "needs --langs"),
])
def test_language_without_its_token_is_refused(data_bin, langs, message):
    with pytest.raises(ValueError, match=message):
        setup(data_bin, *(["--langs", langs] if langs else []))

