"""fairseq-train (in this process) with the CUDA kernels on the emulated device: a few updates of ls_transformer
(packed and padded) and ls_roberta, every dropout on (0.1), give the losses of the same run on the CPU kernels
within the fp32 tolerance of the CUDA tests. The dropout masks are the same by design (one Philox stream on
both devices); what may differ is the kernels' summation order. GEMMs are torch's CPU ones on both sides.
Each emulated run must have launched the kernels it uses (the emulator's launch counts), or a silent fallback
to the CPU kernels would pass.

Marked `e2e` and `cuda_emulated` (make test-cuda-emulated)."""
import os

import pytest

from support.cli import corpus_once, train_args
from support.inprocess import train_losses
from support.roberta import roberta_corpus_once, sentence_prediction_argv
from support.tensors import cpu_kernels
from fairseq_lightseq.ops import _backend

pytestmark = [pytest.mark.e2e, pytest.mark.cuda_emulated]

UPDATES = 4
QUIET = ["--disable-validation", "--no-epoch-checkpoints", "--save-interval", "1000"]
DROPOUT = ["--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]
RTOL = 1e-4  # fp32, 4 updates of Adam after kernels that sum in other orders


# The kernels each run launches on the emulated device (the emulator's kernel names without namespace and
# template arguments): a run that fell back to the CPU kernels, in part or whole, would still train and match.
COMMON = ["emb_fwd_vec_kernel", "emb_bwd_kernel", "ln_fwd_warp_kernel", "ln_bwd_warp_kernel", "column_sums_kernel",
          "adam_kernel"]
PACKED = ["fwd_rows_kernel", "bwd_partial_kernel", "varlen_fwd_kernel", "varlen_bwd_dq_kernel",
          "varlen_bwd_dkv_kernel"]  # bias-act/residual dropout of packed rows, variable-length attention
XENT = ["ls_xent_fwd_kernel", "ls_xent_bwd_kernel"]
KERNELS = {
    "translation_False": COMMON + XENT + [
        "fwd_vec_kernel", "bwd_vec_kernel", "split_heads_vec_kernel", "split_bwd_vec_kernel", "softmax_fwd_vec_kernel",
        "softmax_bwd_vec_kernel", "dropout_rows_kernel", "merge_heads_vec_kernel"],
    "translation_True": COMMON + XENT + PACKED,
    "roberta": COMMON + PACKED + ["mask_rows_kernel"],
}


def launched_since(before):
    """The kernels (names as in KERNELS) the emulated device launched since the counts `before`
    (_backend.emulated_launches())."""
    return {name.split("<")[0].split("::")[-1]
            for name, n in _backend.emulated_launches().items() if n > before.get(name, 0)}


def assert_emulated_equals_cpu(tmp_path_factory, name, argv_of):
    """Trains argv_of(save_dir) on the emulated CUDA device and on the CPU kernels; compares the losses, after
    checking that the emulated run launched each kernel of KERNELS[name]."""
    save = str(tmp_path_factory.mktemp(f"{name}_emulated"))
    before = _backend.emulated_launches()
    emulated = train_losses(argv_of(save), save)
    launched = launched_since(before)
    missing = sorted(set(KERNELS[name]) - launched)
    assert not missing, f"never launched on the emulated device: {missing}; launched: {sorted(launched)}"
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
