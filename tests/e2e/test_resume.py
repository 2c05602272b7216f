"""Resuming and checkpoint safety.

* An interrupted run resumed from checkpoint_last.pt (train.sh rerun with a larger --max-update)
  logs the same per-update losses and ends with the same parameters, bit for bit, as an
  uninterrupted run with the same seed: fairseq restores the data iterator's position inside the
  epoch and reseeds torch (seed + num_updates) before each update, and our dropout draws its
  Philox seed from that generator (ops/dropout_stream.next_seed, once per encoder/decoder forward).
* An unreadable (truncated, corrupted, empty) checkpoint stops fairseq-train and fairseq-generate
  with fairseq_lightseq.checkpoints.io.CheckpointReadError naming the file, its message alone (no
  traceback; patches/refusal_exit.py).
* A failed save never damages an existing checkpoint: fairseq writes NAME.tmp and renames it (we
  also delete the failed .tmp), and checkpoint_io makes the follow-up copies (checkpoint_last.pt)
  atomic, which fairseq alone does not (test_plain_fairseq_copy_truncates_checkpoint_last).
The CLI tests are marked `e2e` and share the prepared corpus of tests/support/recipe.py.
"""
import errno
import os
import shutil
import sys

import pytest
import torch

import fairseq_lightseq  # noqa: F401  (installs checkpoint_io)
from fairseq import checkpoint_utils
from fairseq.dataclass.configs import CheckpointConfig
from fairseq.file_io import PathManager
from fairseq_lightseq.patches import checkpoint_io
from fairseq_lightseq.checkpoints.io import CheckpointReadError

from support.cli import run
from support.recipe import ROOT, prepare_once, train, train_inner


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    return prepare_once(tmp_path_factory)  # the corpus support.recipe prepares, made once

RESUME_ARGS = ["--lr", "1e-3", "--warmup-updates", "4"]  # dropout 0.3 (the recipe's) stays on


def _per_update(log):
    """[(num_updates, loss, nll_loss, gnorm, lr)] from --log-format json --log-interval 1 output."""
    return [(int(r["num_updates"]), r["loss"], r["nll_loss"], r["gnorm"], r["lr"]) for r in train_inner(log)]


@pytest.mark.e2e
def test_resume_matches_uninterrupted_run(prepared):
    d, _ = prepared
    _, full = train(d, "full", "--max-update", "8", *RESUME_ARGS)
    _, first = train(d, "resumed", "--max-update", "4", *RESUME_ARGS)
    _, second = train(d, "resumed", "--max-update", "8", *RESUME_ARGS)
    assert "Loaded checkpoint" in second and "(epoch 1 @ 4 updates)" in second
    assert [u for u, *_ in _per_update(full)] == list(range(1, 9))
    assert _per_update(first) + _per_update(second) == _per_update(full)

    a = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(d, "full", "checkpoint_last.pt"))
    b = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(d, "resumed", "checkpoint_last.pt"))
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    assert a["extra_state"]["train_iterator"]["iterations_in_epoch"] == 8  # resumed mid-epoch
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for (i, sa), sb in zip(a["last_optimizer_state"]["state"].items(), b["last_optimizer_state"]["state"].values()):
        for key in sa:
            assert torch.equal(torch.as_tensor(sa[key]), torch.as_tensor(sb[key])), (i, key)


def _truncated_copy(src, dst, keep=3000):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read(keep))


def _full_checkpoint(d):
    """The 2-update run's checkpoint_last.pt (trained here when an earlier test has not)."""
    ckpt = os.path.join(d, "full", "checkpoint_last.pt")
    if not os.path.exists(ckpt):
        train(d, "full", "--max-update", "2", *RESUME_ARGS)
    return ckpt


@pytest.mark.e2e
def test_resume_from_truncated_checkpoint_fails_clearly(prepared):
    d, _ = prepared
    ckpt = _full_checkpoint(d)
    _truncated_copy(ckpt, os.path.join(d, "broken", "checkpoint_last.pt"))
    rc, out = train(d, "broken", "--max-update", "10", check=False)
    assert rc != 0
    last = out.strip().splitlines()[-1]
    # PROG: the command's name (here the module the recipe runs, python -m fairseq_cli.train)
    assert last.startswith("fairseq_cli.train: error: cannot read checkpoint broken/checkpoint_last.pt "
                           "(3000 bytes)"), last
    assert "truncated or corrupted" in last and "--restore-file" in last
    assert "_pickle" not in last and "Traceback" not in out


@pytest.mark.e2e
def test_generate_with_truncated_checkpoint_fails_clearly(prepared):
    d, _ = prepared
    ckpt = _full_checkpoint(d)
    _truncated_copy(ckpt, os.path.join(d, "broken-gen", "checkpoint_last.pt"), keep=50000)
    rc, out = run([sys.executable, "-m", "fairseq_cli.generate", "out/data-bin", "--user-dir",
                   os.path.join(ROOT, "fairseq_lightseq"), "--path",
                   "broken-gen/checkpoint_last.pt", "--gen-subset", "test", "--cpu"], cwd=d, check=False)
    assert rc != 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("fairseq_cli.generate: error: cannot read checkpoint broken-gen/checkpoint_last.pt "
                           "(50000 bytes)"), last
    assert "Traceback" not in out


# ---------------------------------------------------------------------------------------------
# in-process: reading damaged files, failed saves


@pytest.fixture
def good_checkpoint(tmp_path):
    path = str(tmp_path / "checkpoint_last.pt")
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.randn(4096)}, "args": None}, path)
    return path


def _damage(path, how):
    data = bytearray(open(path, "rb").read())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = b""
    elif how == "garbage":
        data = bytes(range(256)) * 8
    elif how == "header":  # the zip's central directory at the end
        data[-100:] = b"\xff" * 100
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "header"])
def test_damaged_checkpoint_raises_checkpoint_read_error(good_checkpoint, how):
    _damage(good_checkpoint, how)
    with pytest.raises(CheckpointReadError, match=r"cannot read checkpoint .*checkpoint_last\.pt \(\d+ bytes\): "
                                                  r"the file is truncated or corrupted"):
        checkpoint_utils.load_checkpoint_to_cpu(good_checkpoint)
    assert issubclass(CheckpointReadError, RuntimeError)


def test_missing_checkpoint_is_not_reported_as_corrupted(tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "nope.pt"))


def _failing_torch_save(monkeypatch):
    """torch.save that writes a few bytes and then fails like a full disk; no retry sleeps."""
    calls = []

    def save(obj, f, *a, **k):
        calls.append(f)
        f.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(checkpoint_utils.time, "sleep", lambda s: None)  # fairseq retries 3 times
    return calls


def test_failed_save_keeps_previous_checkpoint(good_checkpoint, monkeypatch):
    before = open(good_checkpoint, "rb").read()
    calls = _failing_torch_save(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        checkpoint_utils.torch_persistent_save({"model": {}}, good_checkpoint)
    assert calls, "torch.save was not called"
    assert open(good_checkpoint, "rb").read() == before
    assert not os.path.exists(good_checkpoint + ".tmp")  # the partial file is cleaned up


class _Trainer:
    """What checkpoint_utils.save_checkpoint uses of fairseq's Trainer."""
    data_parallel_rank = 0
    should_save_checkpoint_on_current_rank = True
    always_call_state_dict_during_save_checkpoint = False
    checkpoint_suffix = ""
    task = None

    def __init__(self, updates):
        self.updates = updates

    def consolidate_optimizer(self):
        pass

    def get_num_updates(self):
        return self.updates

    def save_checkpoint(self, filename, extra_state):
        state = {"model": {"w": torch.full((50000,), float(self.updates))}, "extra_state": extra_state}
        checkpoint_utils.torch_persistent_save(state, filename)
        return filename


class _EpochItr:
    epoch = 1

    def end_of_epoch(self):
        return False

    def state_dict(self):
        return {"epoch": 1, "iterations_in_epoch": 0}


def _save(save_dir, updates):
    cfg = CheckpointConfig(save_dir=str(save_dir), save_interval_updates=2, keep_interval_updates=-1,
                           no_epoch_checkpoints=True)
    checkpoint_utils.save_checkpoint(cfg, _Trainer(updates), _EpochItr(), None)


def _updates_in(path):
    return int(torch.load(path)["model"]["w"][0])


def _failing_copyfile(monkeypatch):
    """shutil.copyfile that writes half of the source and fails like a full disk."""
    def copyfile(src, dst, *a, **k):
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read(os.path.getsize(src) // 2))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", copyfile)


def test_save_checkpoint_failed_copy_keeps_checkpoint_last(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    assert _updates_in(tmp_path / "checkpoint_last.pt") == 2
    _failing_copyfile(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, 4)
    monkeypatch.undo()
    assert _updates_in(tmp_path / "checkpoint_1_4.pt") == 4  # written (and complete) before the copy
    assert _updates_in(tmp_path / "checkpoint_last.pt") == 2  # the previous one, intact
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1_2.pt", "checkpoint_1_4.pt", "checkpoint_last.pt"]


def test_plain_fairseq_copy_truncates_checkpoint_last(tmp_path, monkeypatch):
    """Why checkpoint_io replaces the copy: fairseq's PathManager.copy writes onto the destination."""
    _save(tmp_path, 2)
    _failing_copyfile(monkeypatch)
    monkeypatch.setattr(checkpoint_utils, "PathManager", PathManager)
    with pytest.raises(OSError):
        _save(tmp_path, 4)
    monkeypatch.undo()
    with pytest.raises(CheckpointReadError):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "checkpoint_last.pt"))


def test_save_checkpoint_failed_write_keeps_all_checkpoints(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    before = {f: open(tmp_path / f, "rb").read() for f in os.listdir(tmp_path)}
    _failing_torch_save(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, 4)
    monkeypatch.undo()
    assert {f: open(tmp_path / f, "rb").read() for f in os.listdir(tmp_path)} == before  # nothing new, nothing lost


def test_install_is_idempotent():
    load, save = checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.torch_persistent_save
    checkpoint_io.install()
    assert checkpoint_utils.load_checkpoint_to_cpu is load and checkpoint_utils.torch_persistent_save is save
    assert checkpoint_utils.PathManager is checkpoint_io.AtomicCopyPathManager
