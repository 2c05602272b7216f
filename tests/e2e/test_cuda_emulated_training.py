"""fairseq-train (in this process) with the CUDA kernels on the emulated device: a few updates of ls_transformer
(packed and padded) and ls_roberta, every dropout on (0.1), give the losses of the same run on the CPU kernels
within the fp32 tolerance of the CUDA tests. The dropout masks are the same by design (one Philox stream on
both devices); what may differ is the kernels' summation order. GEMMs are torch's CPU ones on both sides.

Marked `e2e` and `cuda_emulated` (make test-cuda-emulated)."""
import os

import pytest

from support.cli import corpus_once, train_args
from support.inprocess import train_losses
from support.roberta import roberta_corpus_once, sentence_prediction_argv
from support.tensors import cpu_kernels

pytestmark = [pytest.mark.e2e, pytest.mark.cuda_emulated]

UPDATES = 4
QUIET = ["--disable-validation", "--no-epoch-checkpoints", "--save-interval", "1000"]
DROPOUT = ["--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]
RTOL = 1e-4  # fp32, 4 updates of Adam after kernels that sum in other orders


def assert_emulated_equals_cpu(tmp_path_factory, name, argv_of):
    """Trains argv_of(save_dir) on the emulated CUDA device and on the CPU kernels; compares the losses."""
    save = str(tmp_path_factory.mktemp(f"{name}_emulated"))
    emulated = train_losses(argv_of(save), save)
    save = str(tmp_path_factory.mktemp(f"{name}_cpu"))
    with cpu_kernels():
        cpu = train_losses(argv_of(save), save)
    assert len(emulated) == len(cpu) == UPDATES
    rel = max(abs(a - b) / abs(b) for a, b in zip(emulated, cpu))
    print(f"{name}: {UPDATES} updates, max relative |emulated CUDA - CPU| loss {rel:.1e}")
    assert rel < RTOL


@pytest.mark.parametrize("packed", [False, True])
def test_translation_on_the_emulated_device_trains_as_on_the_cpu(tmp_path_factory, packed):
    d = corpus_once(tmp_path_factory)
    assert_emulated_equals_cpu(tmp_path_factory, f"translation_{packed}", lambda save: [
        *train_args(os.path.join(d, "bin"), save, UPDATES), *QUIET, *DROPOUT, "--ls-packed", str(packed)])


def test_roberta_on_the_emulated_device_trains_as_on_the_cpu(tmp_path_factory):
    d = roberta_corpus_once(tmp_path_factory)
    argv = sentence_prediction_argv(d, UPDATES, *QUIET, *DROPOUT)
    assert_emulated_equals_cpu(tmp_path_factory, "roberta", lambda save: [*argv, "--save-dir", save])
