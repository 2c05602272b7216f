"""A vanilla fairseq (fairseq-generate without --user-dir) decodes an ls_transformer or ls_mbart_base
(BART's model, here on the translation task) checkpoint converted with `scripts/convert_checkpoint.py --to
fairseq` to our hypotheses, but on torch >= 2.6 only with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: fairseq's
translation and BART checkpoints, its own included, record the legacy model's config as an
`argparse.Namespace`, which torch's safe loader refuses in a process that has not imported the plugin
(fairseq_lightseq/checkpoints/safety.py allows it). The same
command with --user-dir fairseq_lightseq needs no variable. (Language models: tests/e2e/test_lm_cli.py;
their converted config is a plain dict, which loads without the variable.) Marked `e2e`."""
import pytest
import torch

from support.cli import LS, convert, corpus_once, generate, train

pytestmark = pytest.mark.e2e

SHORT = ["--max-len-a", "0", "--max-len-b", "12"]
SAFE_LOADER_BY_DEFAULT = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 6)


@pytest.fixture(scope="module", params=["ls_transformer", "ls_mbart_base"])
def converted(tmp_path_factory, request):
    """(corpus dir, the converted checkpoint, our hypotheses on our checkpoint) after 10 updates of the arch
    and a --to fairseq conversion."""
    d = corpus_once(tmp_path_factory)
    save = f"vanilla_{request.param}"
    train(d, *LS, "--arch", request.param, "--dropout", "0", "--lr", "5e-3", "--max-tokens", "2000",
          "--max-update", "10", "--disable-validation", "--save-dir", save, "--no-epoch-checkpoints")
    convert(f"{save}/checkpoint_last.pt", f"{save}/native.pt", "fairseq", d)
    _, _, ours = generate(d, f"{save}/checkpoint_last.pt", *SHORT)
    assert len(ours) == 40
    return d, f"{save}/native.pt", ours


def _assert_same(hyps, ours):
    """The same hypotheses; scores within fp32 noise (fairseq's layers vs our kernels, or the reverse)."""
    assert sorted(hyps) == sorted(ours)
    assert all(hyps[i][1] == ours[i][1] and abs(hyps[i][0] - ours[i][0]) < 1e-5 for i in ours), (hyps, ours)


@pytest.mark.skipif(not SAFE_LOADER_BY_DEFAULT, reason="torch < 2.6 does not load weights_only by default")
def test_vanilla_fairseq_refuses_it_without_the_variable(converted):
    d, native, _ = converted
    rc, out, hyps = generate(d, native, *SHORT, check=False, user_dir=False)
    assert rc != 0 and not hyps
    assert "argparse.Namespace" in out and "Weights only load failed" in out, out[-3000:]


def test_vanilla_fairseq_with_the_variable_decodes_like_ours(converted):
    d, native, ours = converted
    _, _, hyps = generate(d, native, *SHORT, user_dir=False, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    _assert_same(hyps, ours)


def test_the_same_command_with_the_plugin_needs_no_variable(converted):
    d, native, ours = converted
    _, _, hyps = generate(d, native, *SHORT)
    _assert_same(hyps, ours)
