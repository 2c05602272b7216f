"""fairseq_lightseq.bf16_cli: `--bf16` no longer implies `--tpu`; an explicit TPU request is kept.
fairseq's own argument parsing and config conversion, then fairseq's call_main as the CLIs call it."""
import pytest

import fairseq_lightseq  # noqa: F401  (installs the call_main wrapper)
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq_lightseq import bf16_cli
from fairseq_lightseq.optim.ls_adam import LSAdam


def parsed(*flags, arch="ls_transformer", optimizer="ls_adam"):
    """The config fairseq-train makes from `DATA --arch ARCH --optimizer OPTIMIZER --lr 0.001 --cpu FLAGS`."""
    argv = ["data", "--arch", arch, "--optimizer", optimizer, "--lr", "0.001", "--cpu", *flags]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv)), argv


@pytest.mark.parametrize("stack", [("ls_transformer", "ls_adam"), ("transformer", "adam")], ids=["ls", "native"])
@pytest.mark.parametrize("flags", [["--bf16"], ["--memory-efficient-bf16"]])
def test_bf16_turns_tpu_off(flags, stack):
    cfg, argv = parsed(*flags, arch=stack[0], optimizer=stack[1])
    assert cfg.common.bf16 and cfg.common.tpu  # fairseq's parsing
    assert bf16_cli.untie_bf16_from_tpu(cfg, argv)
    assert cfg.common.bf16 and not cfg.common.tpu
    tpu = {name: cfg[name].tpu for name in cfg if getattr(cfg[name], "tpu", None) is not None}
    assert {"common", "distributed_training", "model"} <= set(tpu) and not any(tpu.values()), tpu


@pytest.mark.parametrize("argv", [["--bf16", "--tpu"], ["common.tpu=true", "common.bf16=true"]])
def test_requested_tpu_is_kept(argv):
    cfg, _ = parsed("--bf16", "--tpu")
    assert not bf16_cli.untie_bf16_from_tpu(cfg, argv)
    assert cfg.common.tpu and cfg.common.bf16


@pytest.mark.parametrize("flags", [[], ["--fp16"]])
def test_other_precisions_untouched(flags):
    cfg, argv = parsed(*flags)
    assert not bf16_cli.untie_bf16_from_tpu(cfg, argv)
    assert not cfg.common.tpu and not cfg.common.bf16


def test_call_main_sees_tpu_off(monkeypatch):
    cfg, argv = parsed("--bf16")
    monkeypatch.setattr("sys.argv", ["fairseq-train", *argv])
    seen = []
    distributed_utils.call_main(cfg, lambda c: seen.append((c.common.bf16, c.common.tpu)))
    assert seen == [(True, False)]
    bf16_cli.install()  # idempotent: wrapped once
    assert not hasattr(distributed_utils.call_main._fls_wrapped, "_fls_wrapped")


@pytest.mark.parametrize("flags,step_with_scale", [([], True), (["--fp16"], True), (["--bf16"], False)])
def test_ls_adam_unscales_itself_only_without_loss_scaler(flags, step_with_scale):
    """FP16Optimizer without a loss scaler (--bf16) never resets its clip factor after a scaled step."""
    import torch

    cfg, _ = parsed(*flags)
    opt = LSAdam(cfg.optimizer, [torch.nn.Parameter(torch.randn(3))])
    assert opt.optimizer.supports_step_with_scale is step_with_scale
