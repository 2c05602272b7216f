"""fairseq_lightseq.patches.cli_config: `--bf16` no longer implies `--tpu` (an explicit TPU request is kept);
`--fp16` on a CPU keeps an fp32 master copy per parameter; torchrun's environment sets up a CPU run. fairseq's own argument parsing and config conversion, then
fairseq's call_main as the CLIs call it."""
import pytest
import torch

import fairseq_lightseq  # noqa: F401  (installs the call_main wrapper)
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq_lightseq.patches import cli_config
from fairseq_lightseq.optim.ls_adam import LSAdam


def parsed(*flags, arch="ls_transformer", optimizer="ls_adam", cpu=True):
    """The config fairseq-train makes from `DATA --arch ARCH --optimizer OPTIMIZER --lr 0.001 --cpu FLAGS`
    (without --cpu when not `cpu`)."""
    argv = ["data", "--arch", arch, "--optimizer", optimizer, "--lr", "0.001", *(["--cpu"] if cpu else []), *flags]
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
    cfg, _ = parsed(*flags)
    opt = LSAdam(cfg.optimizer, [torch.nn.Parameter(torch.randn(3))])
    assert opt.optimizer.supports_step_with_scale is step_with_scale


@pytest.mark.parametrize("stack", [("ls_transformer", "ls_adam"), ("transformer", "adam")], ids=["ls", "native"])
def test_fp16_on_cpu_keeps_a_master_copy_per_parameter(stack, monkeypatch):
    """With fairseq's flat master copy, a CPU parameter never gets its update: the copy is keyed by
    torch.cuda.current_device() (0 under a CUDA torch, stood in for here), the parameter's slice by
    its device.index (None). After the correction the fp16 parameter moves."""
    from fairseq import optim

    cfg, _ = parsed("--fp16", arch=stack[0], optimizer=stack[1])
    assert cfg.common.fp16 and not cfg.common.fp16_no_flatten_grads  # fairseq's parsing
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def step():
        p = torch.nn.Parameter(torch.ones(4, dtype=torch.half))
        opt = optim.FP16Optimizer.build_optimizer(cfg, [p])
        opt.backward(p.float().sum())
        opt.step()
        return p.data

    assert torch.equal(step(), torch.ones(4, dtype=torch.half))  # fairseq's flat copy: nothing happens
    assert cli_config.unflatten_fp16_on_cpu(cfg)
    assert cfg.common.fp16_no_flatten_grads and cfg.model.fp16_no_flatten_grads
    assert (step() < 1).all()  # Adam's first step: 1 - lr


@pytest.mark.parametrize("flags,cpu", [(["--memory-efficient-fp16"], True), (["--bf16"], True),
                                       (["--fp16", "--fp16-no-flatten-grads"], True), ([], True), (["--fp16"], False)],
                         ids=["memory_efficient", "bf16", "already_unflattened", "fp32", "gpu"])
def test_fp16_flattening_left_alone(flags, cpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU run needs a CUDA torch
    cfg, _ = parsed(*flags, cpu=cpu)
    before = cfg.common.fp16_no_flatten_grads
    assert not cli_config.unflatten_fp16_on_cpu(cfg)
    assert cfg.common.fp16_no_flatten_grads == before


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


def test_bf16_on_an_evaluation_command_warns_that_it_runs_fp32(caplog):
    """fairseq-eval-lm (and validate, interactive) cast the model for --fp16 only: --bf16 is said to run in
    float32; fairseq-train's --bf16 trains in bfloat16 and is not warned about; --fp16 is not either."""
    import fairseq_cli.eval_lm
    import fairseq_cli.train

    assert cli_config.command_of(fairseq_cli.eval_lm.main) == "fairseq-eval-lm"
    assert cli_config.command_of(lambda c: None) is None
    cfg, _ = parsed("--bf16")
    assert not cli_config.warn_bf16_evaluates_in_fp32(cfg, fairseq_cli.train.main)
    with caplog.at_level("WARNING", logger="fairseq_lightseq.patches.cli_config"):
        assert cli_config.warn_bf16_evaluates_in_fp32(cfg, fairseq_cli.eval_lm.main)
    assert "--bf16: fairseq-eval-lm runs the model in float32" in caplog.text
    cfg, _ = parsed("--fp16")
    assert not cli_config.warn_bf16_evaluates_in_fp32(cfg, fairseq_cli.eval_lm.main)
