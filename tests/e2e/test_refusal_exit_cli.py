"""A fairseq command that the plugin refuses (errors.Refusal: an option combination at model build, an
unreadable checkpoint) ends with the refusal's one line on stderr, `PROG: error: MESSAGE`, exit status 1
and no traceback (patches/refusal_exit.py): fairseq-train as its own process, one process and two ranks
started by hand over gloo; fairseq-generate; a rank that torch.multiprocessing.spawn started, as fairseq does
on GPUs (on a CPU fairseq starts no ranks itself); mBART fine-tuning's --langs refused when the task is set up.
Marked `e2e`."""
import os
import subprocess
import sys

import pytest
import torch

from support import ROOT
from support.cli import BIN, TINY, USER_DIR, corpus_once, env, free_port
from support.spawned import MESSAGE

pytestmark = pytest.mark.e2e

PACKED_SP = "ls_transformer: --ls-packed True does not combine with --sequence-parallel-size 2"
TRAIN = ["--arch", "ls_transformer", "--criterion", "ls_label_smoothed_cross_entropy", "--optimizer", "ls_adam",
         "--lr", "5e-4", "--max-tokens", "2000", "--max-update", "2", "--no-save", "--disable-validation"]


def processes(cmds, cwd):
    """Runs the commands at once, each its own process; returns [(returncode, stderr)]."""
    procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())
             for c in cmds]
    try:
        errs = [p.communicate(timeout=300)[1] for p in procs]
        return [(p.returncode, err) for p, err in zip(procs, errs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def assert_refused(rc: int, stderr: str, prog: str, message: str, prefix: str = ""):
    """prefix: what torch.distributed puts before each line a rank's exception hook writes ("[rankR]: ")."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    assert rc == 1, f"exit {rc}\n{stderr[-3000:]}"
    assert last.startswith(f"{prefix}{prog}: error: {message}"), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


def fairseq_train(*args):
    return [os.path.join(BIN, "fairseq-train"), "bin", "--user-dir", USER_DIR, *TINY, *TRAIN, *args]


def test_a_refused_option_ends_the_run_with_its_message(tmp_path_factory):
    d = corpus_once(tmp_path_factory)
    [(rc, err)] = processes([fairseq_train("--ls-packed", "True", "--sequence-parallel-size", "2")], d)
    assert_refused(rc, err, "fairseq-train", PACKED_SP)


def test_each_rank_started_by_hand_ends_with_the_message(tmp_path_factory):
    """Two ranks over gloo (--distributed-no-spawn), both refusing at model build."""
    d = corpus_once(tmp_path_factory)
    common = fairseq_train("--ls-packed", "True", "--sequence-parallel-size", "2", "--distributed-world-size", "2",
                           "--distributed-backend", "gloo", "--distributed-no-spawn", "--ddp-backend", "legacy_ddp",
                           "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}")
    for r, (rc, err) in enumerate(processes([[*common, "--distributed-rank", str(r)] for r in range(2)], d)):
        assert_refused(rc, err, "fairseq-train", PACKED_SP, prefix=f"[rank{r}]: ")


def test_langs_without_the_inferred_pair_end_train_and_generate_with_the_message(tmp_path_factory):
    """translation_from_pretrained_bart without -s/-t: fairseq takes the pair (src, tgt) from the data-bin's
    file names, which --langs must list; fairseq-train and fairseq-generate refuse it as they set up the task."""
    d = corpus_once(tmp_path_factory)
    task = ["--task", "translation_from_pretrained_bart", "--langs", "en,de", "--arch", "ls_mbart_base"]
    message = ("--task translation_from_pretrained_bart: the source language src (taken from the data-bin's file "
               "names: no -s/--source-lang given) is not in --langs en,de")
    generate = [os.path.join(BIN, "fairseq-generate"), "bin", "--user-dir", USER_DIR, "--cpu", *task,
                "--path", "absent.pt"]
    for prog, (rc, err) in zip(("fairseq-train", "fairseq-generate"), processes([fairseq_train(*task), generate], d)):
        assert_refused(rc, err, prog, message)


@pytest.fixture
def truncated(tmp_path):
    """The first half of a checkpoint file."""
    whole, part = tmp_path / "whole.pt", tmp_path / "truncated.pt"
    torch.save({"model": {"w": torch.randn(4096)}, "args": None}, whole)
    part.write_bytes(whole.read_bytes()[:os.path.getsize(whole) // 2])
    return str(part)


def test_a_truncated_restore_file_ends_the_run_with_its_message(tmp_path_factory, tmp_path, truncated):
    d = corpus_once(tmp_path_factory)
    [(rc, err)] = processes([fairseq_train("--restore-file", truncated, "--save-dir", str(tmp_path / "save"))], d)
    assert_refused(rc, err, "fairseq-train", f"cannot read checkpoint {truncated} (")


def test_fairseq_generate_ends_with_the_message(tmp_path_factory, truncated):
    d = corpus_once(tmp_path_factory)
    [(rc, err)] = processes([[os.path.join(BIN, "fairseq-generate"), "bin", "--user-dir", USER_DIR, "--path",
                              truncated, "--cpu", "--gen-subset", "test"]], d)
    assert_refused(rc, err, "fairseq-generate", f"cannot read checkpoint {truncated} (")


def test_a_refusal_in_a_spawned_rank_ends_the_parent_with_its_message():
    """The rank's exception reaches the parent as torch's ProcessRaisedException (the rank's traceback as
    text); the parent writes the refusal's line alone."""
    r = subprocess.run([sys.executable, "-m", "support.spawned"], cwd=os.path.join(ROOT, "tests"),
                       capture_output=True, text=True, timeout=300, env=env(PYTHONPATH=ROOT))
    assert_refused(r.returncode, r.stderr, "spawned.py", MESSAGE)
