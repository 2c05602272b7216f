"""scripts/convert_checkpoint.py rewrites the criterion and optimizer names everywhere a fairseq
checkpoint records them (cfg sections, a legacy model's argparse copy, the old `args`, every
optimizer_history entry), limited by --parts, and leaves names without a counterpart alone. The
checkpoint is the shape fairseq-train writes for the legacy `transformer` model. On an unreadable
input (random bytes, a short text file, a truncated checkpoint, no file) it and
scripts/average_checkpoints.py end with one line naming the file and what to do, as fairseq-generate
says it (fairseq_lightseq/checkpoints/io.py), exit status 1, no traceback."""
import argparse
import os
import sys

import pytest

from support import ROOT

from scripts import convert_checkpoint


def native_state(optimizer="adam", optimizer_class="FairseqAdam", wrapper=None):
    """A checkpoint dict as fairseq-train saves it (weights and optimizer tensors left out)."""
    model = argparse.Namespace(_name="transformer", arch="transformer", criterion="label_smoothed_cross_entropy",
                               optimizer=optimizer, encoder_layers=1)
    history = {"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": wrapper or optimizer_class,
               "lr_scheduler_state": {"best": None}, "num_updates": 20}
    return {
        "args": None,
        "cfg": {"model": model,
                "criterion": {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1},
                "optimizer": {"_name": optimizer, "adam_betas": [0.9, 0.98], "lr": [0.001]},
                "optimization": {"lr": [0.001]}},
        "optimizer_history": [dict(history, num_updates=10), history],
        "last_optimizer_state": {"state": {}, "param_groups": []},
    }


def _names(state):
    cfg, hist = state["cfg"], state["optimizer_history"]
    return (cfg["model"].arch, cfg["model"].criterion, cfg["model"].optimizer, cfg["criterion"]["_name"],
            cfg["optimizer"]["_name"], [(h["criterion_name"], h["optimizer_name"]) for h in hist])


def test_to_lightseq_and_back_rewrites_every_record():
    state = native_state()
    changes = convert_checkpoint.convert_state(state, "lightseq")
    assert _names(state) == ("ls_transformer", "ls_label_smoothed_cross_entropy", "ls_adam",
                             "ls_label_smoothed_cross_entropy", "ls_adam",
                             [("LsLabelSmoothedCrossEntropyCriterion", "LSAdam")] * 2)
    assert "optimizer_name FairseqAdam -> LSAdam" in changes
    state["cfg"]["optimizer"]["amsgrad"] = False  # what an ls_adam run records
    convert_checkpoint.convert_state(state, "fairseq")
    assert _names(state) == _names(native_state())
    assert "amsgrad" not in state["cfg"]["optimizer"]  # fairseq's adam config has no such field
    assert state["optimizer_history"][-1]["num_updates"] == 20


def test_old_args_namespace_is_converted():
    state = native_state()
    state["args"] = argparse.Namespace(**vars(state["cfg"]["model"]))
    convert_checkpoint.convert_state(state, "lightseq")
    args = state["args"]
    assert (args.arch, args.criterion, args.optimizer) == ("ls_transformer", "ls_label_smoothed_cross_entropy",
                                                           "ls_adam")


@pytest.mark.parametrize("parts", [["model"], ["model", "criterion"], ["optimizer"]])
def test_parts_limit_the_conversion(parts):
    state = native_state()
    convert_checkpoint.convert_state(state, "lightseq", parts)
    arch, crit, opt, crit_cfg, opt_cfg, hist = _names(state)
    assert (arch == "ls_transformer") == ("model" in parts)
    assert (crit == crit_cfg == "ls_label_smoothed_cross_entropy") == ("criterion" in parts)
    assert (opt == opt_cfg == "ls_adam") == ("optimizer" in parts)
    assert all((h[1] == "LSAdam") == ("optimizer" in parts) for h in hist)


def test_names_without_counterpart_are_kept():
    state = native_state(optimizer="nag", optimizer_class="FairseqNAG")
    convert_checkpoint.convert_state(state, "lightseq")
    assert state["cfg"]["optimizer"]["_name"] == "nag" and state["optimizer_history"][-1]["optimizer_name"] == "FairseqNAG"
    state = native_state(wrapper="MemoryEfficientFP16Optimizer")  # --memory-efficient-fp16: same wrapper for both
    convert_checkpoint.convert_state(state, "lightseq")
    assert state["optimizer_history"][-1]["optimizer_name"] == "MemoryEfficientFP16Optimizer"
    assert state["cfg"]["optimizer"]["_name"] == "ls_adam"


def test_main_reports_the_changes(tmp_path, capsys):
    import torch

    src, dst = str(tmp_path / "native.pt"), str(tmp_path / "ls.pt")
    torch.save(native_state(), src)
    convert_checkpoint.main([src, dst, "--to", "lightseq", "--parts", "model", "optimizer"])
    out = capsys.readouterr().out
    assert "arch transformer -> ls_transformer" in out and "optimizer_name FairseqAdam -> LSAdam" in out
    assert "criterion" not in out
    assert torch.load(dst)["cfg"]["criterion"]["_name"] == "label_smoothed_cross_entropy"


@pytest.mark.parametrize("arch,criterion,criterion_class,ls_criterion,ls_class", [
    ("roberta_base", "masked_lm", "MaskedLmLoss", "ls_masked_lm", "LsMaskedLmLoss"),
    ("roberta_prenorm", "sentence_prediction", "SentencePredictionCriterion", "sentence_prediction",
     "SentencePredictionCriterion"),  # fine-tuning: fairseq's criterion on both sides
])
def test_roberta_names_both_ways(arch, criterion, criterion_class, ls_criterion, ls_class):
    """The masked_lm family through the same table (fairseq_lightseq/models/families.py): no branch of its own."""
    state = native_state()
    model = state["cfg"]["model"]
    model._name = model.arch = arch
    model.criterion = state["cfg"]["criterion"]["_name"] = criterion
    for h in state["optimizer_history"]:
        h["criterion_name"] = criterion_class
    convert_checkpoint.convert_state(state, "lightseq")
    assert (model.arch, model._name, model.criterion, state["cfg"]["criterion"]["_name"]) == \
        ("ls_" + arch, "ls_" + arch, ls_criterion, ls_criterion)
    assert state["optimizer_history"][-1]["criterion_name"] == ls_class
    convert_checkpoint.convert_state(state, "fairseq")
    assert (model.arch, model.criterion, state["optimizer_history"][-1]["criterion_name"]) == \
        (arch, criterion, criterion_class)
    assert isinstance(state["cfg"]["model"], argparse.Namespace)  # a legacy model on both sides


def _unreadable(d, case):
    """A path in d that is not a readable checkpoint: random bytes, a short text file, the first half
    of a real checkpoint, or no file at all."""
    import random

    import torch

    path = os.path.join(d, f"{case}.pt")
    if case == "random":
        open(path, "wb").write(random.Random(0).randbytes(3000))
    elif case == "text":
        open(path, "w").write("hello\n")
    elif case == "truncated":
        torch.save(dict(native_state(), model={"w": torch.zeros(20000)}), path)
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    return path


def _assert_one_clear_line(rc, out, prog, path, missing):
    """Exit status 1 and, after the script's own progress lines, one line naming the file and what to do."""
    assert rc == 1 and "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: cannot read checkpoint {path}"), out
    if missing:
        assert "no such file. Check the path" in last, last
    else:
        assert "truncated or corrupted" in last and "--restore-file" in last, last
        assert "weights_only" not in last  # torch's retry advice does not fit a damaged file


@pytest.mark.parametrize("case", ["random", "text", "truncated", "missing"])
def test_convert_script_on_an_unreadable_file(tmp_path, case):
    from support.cli import CONVERT, run

    path = _unreadable(str(tmp_path), case)
    rc, out = run([sys.executable, CONVERT, path, str(tmp_path / "out.pt"), "--to", "lightseq"], str(tmp_path),
                  check=False)
    _assert_one_clear_line(rc, out, "convert_checkpoint.py", path, case == "missing")
    assert not os.path.exists(tmp_path / "out.pt")


@pytest.mark.parametrize("case", ["random", "missing"])
def test_average_script_on_an_unreadable_file(tmp_path, case):
    """scripts/average_checkpoints.py reads through fairseq's (wrapped) loader: the same message."""
    from support.cli import run

    path = _unreadable(str(tmp_path), case)
    rc, out = run([sys.executable, os.path.join(ROOT, "scripts", "average_checkpoints.py"), "--inputs", path,
                   "--output", str(tmp_path / "avg.pt")], str(tmp_path), check=False)
    _assert_one_clear_line(rc, out, "average_checkpoints.py", path, case == "missing")
