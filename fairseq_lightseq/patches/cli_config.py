"""Three corrections to the config fairseq's command-line tools build from their arguments, applied
before the tool runs: `--bf16` trains in bfloat16 on the run's own device, `--fp16` trains on a CPU,
and `torchrun` launches CPU training.

Where: fairseq's argument post-processing (`fairseq.options.parse_args_and_arch`) runs inside the call
that imports this plugin (`--user-dir`), so it cannot be changed there; the first fairseq function the
CLIs (fairseq-train, fairseq-validate, ...) look up afterwards is
`fairseq.distributed.utils.call_main(cfg, main)`, which we wrap.

1. `--bf16` (`untie_bf16_from_tpu`). fairseq 0.12 sets `tpu` whenever `--bf16` (or
   `--memory-efficient-bf16`) is given, a leftover from when bf16 meant TPU. With `tpu` on,
   fairseq-train neither moves the model to CUDA nor detects torchrun, and its Trainer takes the XLA
   path, which needs torch_xla. fairseq's Trainer itself already trains in bf16 on CUDA and CPU (model
   in bfloat16, fp32 master weights in its FP16Optimizer) once `tpu` is off. So when `bf16` and `tpu`
   are both set but a TPU was not asked for, `tpu` is turned off in every section that holds a copy
   of it (`common`, `distributed_training` whose torchrun detection it disables, the optimizer's and
   task's where they have one, the legacy `model` namespace). A TPU is asked for by `--tpu` (or
   hydra's `common.tpu=true`) on the command line; such runs are left exactly as fairseq runs them.
   The model architecture plays no part: this holds for `ls_transformer*` and fairseq's own models.
   fairseq's evaluation commands (fairseq-eval-lm, fairseq-validate, fairseq-interactive) cast the
   model only for --fp16, so under --bf16 they run it in float32, as fairseq alone does: that is kept
   (the same numbers as fairseq's for the same command line) and said in a warning
   (`warn_bf16_evaluates_in_fp32`).
2. torchrun on CPU (`infer_torchrun_on_cpu`). fairseq detects torchrun (MASTER_ADDR, MASTER_PORT,
   WORLD_SIZE, RANK in the environment) only when its `--distributed-world-size` is not 1 (its default
   is the number of GPUs, 1 without any), and then computes `device_id = rank %
   torch.cuda.device_count()`, a division by zero without GPUs. For a CPU run (`--cpu` or no CUDA)
   started by torchrun we fill in what fairseq would: `env://`, world size and rank from torchrun, no
   spawning, and device 0. GPU runs are left to fairseq.
3. `--fp16` on a CPU (`unflatten_fp16_on_cpu`). fairseq's FP16Optimizer keeps its fp32 master copy
   as one flat tensor per CUDA device unless `--fp16-no-flatten-grads`: it keys that tensor by
   `torch.cuda.current_device()` (on a torch without CUDA: "Torch not compiled with CUDA enabled"
   before the first update) and later finds a parameter's slice by `p.device.index`, which is None
   for CPU tensors (with a CUDA torch and `--cpu`, no gradient would ever reach the master copy and
   the model would never change). So for a CPU run with `--fp16` (not `--memory-efficient-fp16`,
   which keeps no master copy) we set `fp16_no_flatten_grads`, as fairseq itself does for every
   bf16 run: one fp32 copy per parameter, the same update. GPU runs are left to fairseq.
   fairseq's trainer still calls `.cuda()` when it meets an fp16 overflow (trainer.py, the
   OverflowError handler), for every model and both fp16 forms; that is inside its train_step and
   is not changed here (see the README's known limits).

The wrapper also runs fairscale_engines.check before a training command (its refusals must come before
fairseq-train imports fairscale).
"""
import logging
import os
import sys
from typing import Optional, Sequence

import torch
from fairseq.distributed import utils as distributed_utils

from . import fairscale_engines
from .wrap import wrap

logger = logging.getLogger(__name__)

TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
# fairseq's commands that run a trained model through call_main (fairseq-generate calls its main itself)
EVALUATION_COMMANDS = ("fairseq-eval-lm", "fairseq-validate", "fairseq-hydra-validate", "fairseq-interactive")


def tpu_requested(argv: Sequence[str]) -> bool:
    """Whether the command line `argv` asks for a TPU itself (rather than fairseq inferring it from --bf16)."""
    return any(a == "--tpu" or a.lstrip("+").startswith("common.tpu=") for a in argv)


def untie_bf16_from_tpu(cfg, argv: Sequence[str], training: bool = True) -> bool:
    """Turns `tpu` off in `cfg` when fairseq set it only because of --bf16; returns whether it did.
    training: whether the command trains (only then does --bf16 put the model in bfloat16, and is it said)."""
    common = cfg.common
    if not (common.bf16 and common.tpu) or tpu_requested(argv):
        return False
    for name in cfg:  # convert_namespace_to_omegaconf copied the value into several sections
        section = cfg[name]
        if getattr(section, "tpu", None) is True:
            section.tpu = False
    if training:
        device = "CPU" if common.cpu else "CUDA"
        logger.info(f"fairseq_lightseq: --bf16 without --tpu: training in bfloat16 on {device} "
                    f"(fairseq 0.12 would have switched to --tpu)")
    return True


def command_of(main) -> Optional[str]:
    """The console script whose `main` call_main runs, from the file that defines it (also under
    `python -m fairseq_cli.eval_lm`): fairseq_cli/eval_lm.py -> "fairseq-eval-lm"; None for a function
    from outside fairseq_cli."""
    path = getattr(getattr(main, "__code__", None), "co_filename", "")
    folder, name = os.path.split(os.path.splitext(path)[0])
    return "fairseq-" + name.replace("_", "-") if os.path.basename(folder) == "fairseq_cli" else None


def evaluates(main) -> bool:
    """Whether call_main's `main` is one of fairseq's evaluation commands (EVALUATION_COMMANDS)."""
    return command_of(main) in EVALUATION_COMMANDS


def warn_bf16_evaluates_in_fp32(cfg, main) -> bool:
    """fairseq's evaluation commands (fairseq-eval-lm, fairseq-validate, fairseq-interactive) cast the
    model only for --fp16 (model.half()); with --bf16 (and no --fp16) they run it in float32, as fairseq
    alone does. Says so as a warning; returns whether it did."""
    common = cfg.common
    if not evaluates(main) or not (common.bf16 or common.memory_efficient_bf16) or common.fp16:
        return False
    logger.warning(f"fairseq_lightseq: --bf16: {command_of(main)} runs the model in float32, as fairseq does "
                   f"(its evaluation commands cast the model only for --fp16); --bf16 applies to fairseq-train")
    return True


def infer_torchrun_on_cpu(cfg, environ=os.environ) -> bool:
    """For a CPU run started by torchrun (TORCHRUN_VARS in `environ`) and no --distributed-init-method,
    sets cfg.distributed_training as fairseq does for a GPU run under torchrun; returns whether it did."""
    dt = cfg.distributed_training
    on_cpu = cfg.common.cpu or not torch.cuda.is_available()
    if not on_cpu or cfg.common.tpu or dt.distributed_init_method is not None or \
            not all(k in environ for k in TORCHRUN_VARS):
        return False
    dt.distributed_init_method = "env://"
    dt.distributed_world_size = int(environ["WORLD_SIZE"])
    dt.distributed_rank = int(environ["RANK"])
    dt.device_id = 0
    dt.distributed_no_spawn = True  # torchrun started the processes
    return True


def unflatten_fp16_on_cpu(cfg) -> bool:
    """Sets fp16_no_flatten_grads for a CPU run (`--cpu` or no CUDA) with --fp16 and fairseq's flat fp32
    master copy, which only works on CUDA; returns whether it did."""
    common = cfg.common
    on_cpu = common.cpu or not torch.cuda.is_available()
    if not (on_cpu and common.fp16) or common.memory_efficient_fp16 or common.fp16_no_flatten_grads or common.tpu:
        return False
    for name in cfg:  # the legacy `model` namespace holds a copy too
        section = cfg[name]
        if getattr(section, "fp16_no_flatten_grads", None) is False:
            section.fp16_no_flatten_grads = True
    logger.info("fairseq_lightseq: --fp16 on CPU: fp32 master weights per parameter (--fp16-no-flatten-grads); "
                "fairseq's flat copy needs CUDA")
    return True


def _wrap_call_main(call_main):
    def wrapped(cfg, main, **kwargs):
        untie_bf16_from_tpu(cfg, sys.argv[1:], training=not evaluates(main))
        warn_bf16_evaluates_in_fp32(cfg, main)
        infer_torchrun_on_cpu(cfg)
        unflatten_fp16_on_cpu(cfg)
        if not evaluates(main):  # the same wrapper also runs the training command's early refusals
            fairscale_engines.check(cfg)
        return call_main(cfg, main, **kwargs)
    return wrapped


def install() -> None:
    """Wraps fairseq.distributed.utils.call_main (idempotent)."""
    wrap(distributed_utils, "call_main", _wrap_call_main)
