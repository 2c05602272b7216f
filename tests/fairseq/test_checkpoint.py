"""Checkpoints: torch's safe (weights_only) loader reads fairseq checkpoints once fairseq_lightseq
is imported, still refuses foreign objects; scripts/convert_checkpoint.py rewrites only the names."""
import argparse
import collections
import os
import pickle
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

import fairseq_lightseq  # noqa: F401  (registers the safe globals)
from fairseq import checkpoint_utils
from fairseq.models.transformer import TransformerModel
from fairseq_lightseq.models.ls_transformer import LSTransformerModel

from support.models import TINY, build, make_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts import convert_checkpoint  # noqa: E402


def fairseq_like_state(model, arch, omegaconf_cfg=False):
    """What fairseq's checkpoint_utils.save_state writes for a legacy (argparse) model; with
    omegaconf_cfg, `cfg` is a DictConfig as in checkpoints of older fairseq versions."""
    model_args = argparse.Namespace(**TINY, arch=arch, _name=arch)
    cfg = {"common": {"user_dir": None, "fp16": False}, "model": model_args,
           "optimization": {"lr": [0.001], "max_update": 30}}
    if omegaconf_cfg:
        cfg = OmegaConf.create({"common": cfg["common"], "optimization": cfg["optimization"],
                                "model": {"_name": arch, "arch": arch, "dropout": 0.0, "layers": [1, 2]}})
    return {
        "args": None if not omegaconf_cfg else argparse.Namespace(arch=arch),
        "cfg": cfg,
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam", "lr_scheduler_state": {"best": None},
                               "num_updates": 30}],
        "task_state": {},
        "extra_state": {"metrics": collections.OrderedDict(), "train_iterator": {"epoch": 2},
                        "meters": collections.defaultdict(list)},
        "last_optimizer_state": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(3)}},
                                 "param_groups": [{"lr": 0.001, "betas": (0.9, 0.98), "params": [0]}]},
    }


@pytest.mark.parametrize("omegaconf_cfg", [False, True], ids=["namespace_cfg", "dictconfig_cfg"])
def test_fairseq_checkpoint_loads_with_weights_only(tmp_path, omegaconf_cfg):
    model = build(LSTransformerModel, make_task())
    path = str(tmp_path / "ckpt.pt")
    torch.save(fairseq_like_state(model, "ls_transformer_tiny", omegaconf_cfg), path)
    state = torch.load(path, map_location="cpu", weights_only=True)  # explicit: the safe loader
    assert torch.equal(state["model"]["encoder.embed_tokens.weight"], model.encoder.embed_tokens.weight)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)  # fairseq's path (torch's default loader)
    assert state["optimizer_history"][0]["num_updates"] == 30


class Foreign:
    """A class no checkpoint should contain."""

    def __init__(self):
        self.x = 1


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["custom_class", "os_system_reduce"])
def test_foreign_objects_are_refused(tmp_path, kind):
    marker = tmp_path / "pwned"
    state = fairseq_like_state(build(LSTransformerModel, make_task()), "ls_transformer_tiny")
    state["extra_state"]["payload"] = Foreign() if kind == "custom_class" else Exploit(str(marker))
    path = str(tmp_path / "evil.pt")
    torch.save(state, path)
    # torch names the refused global: "...Unsupported global: GLOBAL test_checkpoint.Foreign..." or
    # "...unsupported GLOBAL posix.system whose module posix is blocked..."
    expected = "Foreign" if kind == "custom_class" else "posix.system"
    for load in (lambda: torch.load(path, map_location="cpu"), lambda: checkpoint_utils.load_checkpoint_to_cpu(path)):
        with pytest.raises(pickle.UnpicklingError, match=expected):
            load()
    assert not marker.exists()


def _save_with_numpy(tmp_path, value, numpy1_names=False):
    """A fairseq-like checkpoint holding `value` in extra_state (where --eval-bleu's validation meters
    keep numpy arrays); numpy1_names: the pickle refers to numpy 1's module `numpy.core.multiarray`
    (checkpoints written with numpy < 2)."""
    import io
    import zipfile

    state = fairseq_like_state(build(LSTransformerModel, make_task()), "ls_transformer_tiny")
    state["extra_state"]["best"] = value
    path = str(tmp_path / "np.pt")
    torch.save(state, path)
    if numpy1_names:
        src = zipfile.ZipFile(path)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for item in src.infolist():
                data = src.read(item.filename)
                if item.filename.endswith("data.pkl"):
                    assert b"numpy._core.multiarray" in data
                    data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
                dst.writestr(item, data)
        src.close()
        with open(path, "wb") as f:
            f.write(out.getvalue())
    return path


NUMERIC = {"float64_scalar": lambda np: np.float64(31.41), "int64_scalar": lambda np: np.int64(-7),
           "bool_scalar": lambda np: np.bool_(True), "float32_array": lambda np: np.random.rand(2, 3).astype(np.float32),
           "int8_array": lambda np: np.arange(-3, 3, dtype=np.int8), "float16_0d": lambda np: np.array(0.5, np.float16)}


@pytest.mark.parametrize("numpy1_names", [False, True], ids=["numpy2_names", "numpy1_names"])
@pytest.mark.parametrize("kind", sorted(NUMERIC))
def test_numpy_numeric_values_load(tmp_path, kind, numpy1_names):
    import numpy as np

    value = NUMERIC[kind](np)
    path = _save_with_numpy(tmp_path, value, numpy1_names)
    for load in (lambda: torch.load(path, map_location="cpu"), lambda: checkpoint_utils.load_checkpoint_to_cpu(path)):
        best = load()["extra_state"]["best"]
        assert type(best) is type(value) and best.dtype == value.dtype and np.array_equal(best, value)


@pytest.mark.parametrize("kind", ["object_array", "object_array_with_exploit", "structured_array", "str_array"])
def test_numpy_non_numeric_values_are_refused(tmp_path, kind):
    """An object array would rebuild arbitrary pickled objects; only numeric dtypes are allowed."""
    import numpy as np

    marker = tmp_path / "pwned"
    value = {"object_array": lambda: np.array([1, "a"], dtype=object),
             "object_array_with_exploit": lambda: np.array([Exploit(str(marker))], dtype=object),
             "structured_array": lambda: np.zeros(2, dtype="i4,f8"),
             "str_array": lambda: np.array(["ab"])}[kind]()
    path = _save_with_numpy(tmp_path, value)
    expected = {"object_array": "ObjectDType", "object_array_with_exploit": "ObjectDType|posix.system",
                "structured_array": "VoidDType", "str_array": "StrDType"}[kind]
    # torch's refusal, passed on unchanged (not reported as a damaged file)
    for load in (lambda: torch.load(path, map_location="cpu"), lambda: checkpoint_utils.load_checkpoint_to_cpu(path)):
        with pytest.raises(pickle.UnpicklingError, match=expected):
            load()
    assert not marker.exists()


@pytest.mark.parametrize("omegaconf_cfg", [False, True], ids=["namespace_cfg", "dictconfig_cfg"])
def test_convert_roundtrip_keeps_everything_but_names(tmp_path, omegaconf_cfg):
    task = make_task()
    ours = build(LSTransformerModel, task)
    src, dst, back = (str(tmp_path / n) for n in ("ls.pt", "fs.pt", "back.pt"))
    torch.save(fairseq_like_state(ours, "ls_transformer_tiny", omegaconf_cfg), src)
    convert_checkpoint.main([src, dst, "--to", "fairseq"])
    fs_state = torch.load(dst, map_location="cpu")
    model_cfg = fs_state["cfg"]["model"]
    names = (model_cfg["_name"], model_cfg["arch"]) if omegaconf_cfg else (model_cfg._name, model_cfg.arch)
    assert names == ("transformer_tiny", "transformer_tiny")
    if omegaconf_cfg:
        assert fs_state["args"].arch == "transformer_tiny"
    ref = build(TransformerModel, task)
    ref.load_state_dict(fs_state["model"], strict=True)
    assert fs_state["last_optimizer_state"]["state"][0]["exp_avg"].equal(torch.ones(3))
    assert fs_state["optimizer_history"][0]["num_updates"] == 30
    convert_checkpoint.main([dst, back, "--to", "lightseq"])
    orig, again = torch.load(src, map_location="cpu"), torch.load(back, map_location="cpu")
    assert again["model"].keys() == orig["model"].keys()
    assert all(torch.equal(again["model"][k], orig["model"][k]) for k in orig["model"])
    name = again["cfg"]["model"]["_name"] if omegaconf_cfg else again["cfg"]["model"]._name
    assert name == "ls_transformer_tiny"


def test_convert_rejects_unknown_architecture(tmp_path):
    src = str(tmp_path / "x.pt")
    # fairseq's adaptive-input LM arch has no ls counterpart
    torch.save(fairseq_like_state(build(TransformerModel, make_task()), "transformer_lm_wiki103"), src)
    # one line naming the file and the architecture, no traceback
    with pytest.raises(SystemExit, match=r"convert_checkpoint.py: .*x.pt: .*transformer_lm_wiki103"):
        convert_checkpoint.main([src, str(tmp_path / "y.pt"), "--to", "lightseq"])
    assert not os.path.exists(tmp_path / "y.pt")


def test_convert_script_runs_as_a_command(tmp_path):
    src, dst = str(tmp_path / "ls.pt"), str(tmp_path / "fs.pt")
    torch.save(fairseq_like_state(build(LSTransformerModel, make_task()), "ls_transformer_tiny"), src)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "convert_checkpoint.py"), src, dst,
                        "--to", "fairseq"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert torch.load(dst)["cfg"]["model"].arch == "transformer_tiny"
