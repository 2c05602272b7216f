"""`--optimizer ls_adam`: fairseq's `adam` with one fused multi-tensor kernel per step.

The numbers are fairseq's adam (fairseq/optim/adam.py, "AdamW-like" weight decay); the per-param
state is exactly fairseq adam's (`step` int, `exp_avg`, `exp_avg_sq` fp32, same parameter order), so
the optimizer state of a checkpoint serves either optimizer unchanged. fairseq's --restore-file
also checks the optimizer's class name recorded in the checkpoint (FairseqAdam vs LSAdam):
scripts/convert_checkpoint.py rewrites it (with the criterion's and the model's names), after which
a run continues with the other optimizer, num_updates and lr schedule included; without the
conversion only --reset-optimizer (which restarts them) gets past that check.
"""
import logging
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import OPTIMIZER_REGISTRY, FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from ..ops import adam as adam_ops

logger = logging.getLogger(__name__)

_HALF = (torch.float16, torch.bfloat16)


@dataclass
class LSAdamConfig(FairseqDataclass):
    """fairseq's FairseqAdamConfig plus `amsgrad` (which ls_adam rejects)."""

    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    amsgrad: bool = field(default=False, metadata={"help": "not supported by ls_adam (an error if set)"})
    use_old_adam: bool = field(default=False, metadata={"help": "ignored (accepted for fairseq adam compatibility)"})
    fp16_adam_stats: bool = field(default=False, metadata={"help": "not supported by ls_adam (an error if set)"})
    tpu: bool = II("common.tpu")  # accepted; see LSAdam.__init__
    lr: List[float] = II("optimization.lr")


class FusedAdam(torch.optim.Optimizer):
    """Adam as fairseq's `Adam` (same update, same state), applied by the fused multi-tensor op.

    Params may be fp32 (fp32 training, FP16Optimizer's fp32 master params) or fp16/bf16
    (--memory-efficient-fp16/bf16: updated through a temporary fp32 copy as fairseq's adam does);
    grads fp32/fp16/bf16. State per param: `step` (int), `exp_avg`, `exp_avg_sq` (fp32).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
                 step_with_scale=True):
        _reject_amsgrad(amsgrad)
        self.supports_step_with_scale = step_with_scale
        if not 0.0 <= lr:
            raise ValueError(f"ls_adam: lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"ls_adam: betas must be in [0, 1), got {betas}")
        if not 0.0 <= eps:
            raise ValueError(f"ls_adam: eps must be >= 0, got {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"ls_adam: weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False))

    # Capabilities fairseq's wrappers query (FP16Optimizer / MemoryEfficientFP16Optimizer).
    supports_memory_efficient_fp16 = True
    supports_flat_params = True
    # supports_step_with_scale (set per instance): step(scale=s) divides the grads by s inside the
    # kernel, so FP16Optimizer skips its separate unscaling pass over all gradients.

    @torch.no_grad()
    def step(self, closure=None, scale=1.0):
        """One update of every param with a grad; grads are divided by `scale` (float or 0-dim tensor)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = 1.0 / float(scale)
        for group in self.param_groups:
            _reject_amsgrad(group.get("amsgrad", False))
            beta1, beta2 = group["betas"]
            buckets = defaultdict(lambda: ([], [], [], []))  # by step number (normally one bucket)
            copy_back = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("ls_adam does not support sparse gradients")
                p32 = p.data.float() if p.dtype in _HALF else p.data
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p32, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p32, memory_format=torch.contiguous_format)
                else:
                    # As fairseq: state loaded from a checkpoint may sit on another device/dtype.
                    state["exp_avg"] = state["exp_avg"].to(p32)
                    state["exp_avg_sq"] = state["exp_avg_sq"].to(p32)
                state["step"] = int(state["step"]) + 1
                lists = buckets[state["step"]]
                for lst, t in zip(lists, (p32, grad, state["exp_avg"], state["exp_avg_sq"])):
                    lst.append(t)
                if p32 is not p.data:
                    copy_back.append((p, p32))
            for step, (ps, gs, ms, vs) in buckets.items():
                adam_ops.adam_step(ps, gs, ms, vs, step, group["lr"], beta1, beta2, group["eps"],
                                   group["weight_decay"], grad_scale)
            for p, p32 in copy_back:
                p.data.copy_(p32)
        return loss


def _reject_amsgrad(amsgrad):
    if amsgrad:
        raise ValueError("ls_adam does not implement amsgrad=True; use --optimizer adam for AMSGrad")


class LSAdam(FairseqOptimizer):
    """fairseq optimizer `ls_adam`: the options of fairseq's `adam`, the fused update (FusedAdam)."""

    def __init__(self, cfg: LSAdamConfig, params):
        super().__init__(cfg)
        _reject_amsgrad(getattr(cfg, "amsgrad", False))
        if getattr(cfg, "fp16_adam_stats", False):
            raise ValueError("ls_adam keeps Adam statistics in fp32; --fp16-adam-stats is not supported")
        # cfg.tpu is ignored: fairseq sets it for every --bf16 run. Tensors on a device without a
        # compiled kernel (e.g. XLA) are updated by the reference op (with a one-time warning).
        # fairseq's FP16Optimizer without a loss scaler (--bf16) never resets its multiply factor
        # after a step-with-scale, so the clip factor would compound over steps: under --bf16
        # (which fairseq marks with cfg.tpu) let it unscale the grads itself.
        self._optimizer = FusedAdam(params, **self.optimizer_config,
                                    step_with_scale=not getattr(cfg, "tpu", False))

    @property
    def optimizer_config(self):
        """The kwargs that override the optimizer args stored in checkpoints (as fairseq's adam)."""
        return {
            "lr": self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr,
            "betas": eval(self.cfg.adam_betas) if isinstance(self.cfg.adam_betas, str)
            else OmegaConf.to_container(self.cfg.adam_betas) if OmegaConf.is_config(self.cfg.adam_betas)
            else tuple(self.cfg.adam_betas),
            "eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
        }

    def average_params(self):
        """Reduce Params is only used during BMUF distributed training (as fairseq's adam)."""
        import torch.distributed as dist

        state_dict = self.optimizer.state_dict()
        total_gpus = float(dist.get_world_size())
        for _, value in state_dict["state"].items():
            value["exp_avg"] /= total_gpus
            value["exp_avg_sq"] /= total_gpus
            dist.all_reduce(value["exp_avg"], op=dist.ReduceOp.SUM)
            dist.all_reduce(value["exp_avg_sq"], op=dist.ReduceOp.SUM)


# Registered once even if this module is imported twice (package import and --user-dir).
if "ls_adam" not in OPTIMIZER_REGISTRY:
    register_optimizer("ls_adam", dataclass=LSAdamConfig)(LSAdam)
