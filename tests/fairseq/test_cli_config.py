"""fairseq_lightseq.cli_config: `--bf16` no longer implies `--tpu` (an explicit TPU request is kept);
torchrun's environment sets up a CPU run. fairseq's own argument parsing and config conversion, then
fairseq's call_main as the CLIs call it."""
import pytest

import fairseq_lightseq  # noqa: F401  (installs the call_main wrapper)
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq_lightseq import cli_config
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
    assert cli_config.untie_bf16_from_tpu(cfg, argv)
    assert cfg.common.bf16 and not cfg.common.tpu
    tpu = {name: cfg[name].tpu for name in cfg if getattr(cfg[name], "tpu", None) is not None}
    assert {"common", "distributed_training", "model"} <= set(tpu) and not any(tpu.values()), tpu


@pytest.mark.parametrize("argv", [["--bf16", "--tpu"], ["common.tpu=true", "common.bf16=true"]])
def test_requested_tpu_is_kept(argv):
    cfg, _ = parsed("--bf16", "--tpu")
    assert not cli_config.untie_bf16_from_tpu(cfg, argv)
    assert cfg.common.tpu and cfg.common.bf16


@pytest.mark.parametrize("flags", [[], ["--fp16"]])
def test_other_precisions_untouched(flags):
    cfg, argv = parsed(*flags)
    assert not cli_config.untie_bf16_from_tpu(cfg, argv)
    assert not cfg.common.tpu and not cfg.common.bf16


def test_call_main_sees_tpu_off(monkeypatch):
    cfg, argv = parsed("--bf16")
    monkeypatch.setattr("sys.argv", ["fairseq-train", *argv])
    seen = []
    distributed_utils.call_main(cfg, lambda c: seen.append((c.common.bf16, c.common.tpu)))
    assert seen == [(True, False)]
    cli_config.install()  # idempotent: wrapped once
    assert not hasattr(distributed_utils.call_main._fls_wrapped, "_fls_wrapped")


@pytest.mark.parametrize("flags,step_with_scale", [([], True), (["--fp16"], True), (["--bf16"], False)])
def test_ls_adam_unscales_itself_only_without_loss_scaler(flags, step_with_scale):
    """FP16Optimizer without a loss scaler (--bf16) never resets its clip factor after a scaled step."""
    import torch

    cfg, _ = parsed(*flags)
    opt = LSAdam(cfg.optimizer, [torch.nn.Parameter(torch.randn(3))])
    assert opt.optimizer.supports_step_with_scale is step_with_scale


TORCHRUN_ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}


def test_torchrun_on_cpu_sets_up_env_init():
    cfg, _ = parsed("--distributed-backend", "gloo")
    dt = cfg.distributed_training
    assert dt.distributed_world_size == 1 and dt.distributed_init_method is None  # fairseq's CPU default
    assert cli_config.infer_torchrun_on_cpu(cfg, TORCHRUN_ENV)
    assert (dt.distributed_init_method, dt.distributed_world_size, dt.distributed_rank, dt.device_id,
            dt.distributed_no_spawn) == ("env://", 2, 1, 0, True)


@pytest.mark.parametrize("case", ["no_torchrun", "explicit_init_method", "tpu"])
def test_torchrun_inference_left_alone(case):
    flags = {"no_torchrun": [], "explicit_init_method": ["--distributed-init-method", "tcp://127.0.0.1:1"],
             "tpu": ["--tpu"]}[case]
    cfg, _ = parsed(*flags)
    before = dict(cfg.distributed_training)
    environ = {} if case == "no_torchrun" else TORCHRUN_ENV
    assert not cli_config.infer_torchrun_on_cpu(cfg, environ)
    assert dict(cfg.distributed_training) == before
