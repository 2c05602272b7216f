"""`--optimizer ls_adam`: fairseq's `adam` with one fused multi-tensor kernel per step (the torch
optimizer FusedAdam, fused_adam.py; this module is fairseq's side: options, gradient factor, clipping).

The numbers are fairseq's adam (fairseq/optim/adam.py, "AdamW-like" weight decay); the per-param
state is exactly fairseq adam's (`step` int, `exp_avg`, `exp_avg_sq` fp32, same parameter order), so
the optimizer state of a checkpoint serves either optimizer unchanged. fairseq's --restore-file
also checks the optimizer's class name recorded in the checkpoint (FairseqAdam vs LSAdam):
scripts/convert_checkpoint.py rewrites it (with the criterion's and the model's names), after which
a run continues with the other optimizer, num_updates and lr schedule included; without the
conversion only --reset-optimizer (which restarts them) gets past that check.
"""
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import OPTIMIZER_REGISTRY, FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from ..errors import ConfigurationError
from .fused_adam import FusedAdam, reject_amsgrad


@dataclass
class LSAdamConfig(FairseqDataclass):
    """fairseq's FairseqAdamConfig plus `amsgrad` (which ls_adam rejects)."""

    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    amsgrad: bool = field(default=False, metadata={"help": "not supported by ls_adam (an error if set)"})
    use_old_adam: bool = field(default=False, metadata={"help": "ignored (accepted for fairseq adam compatibility)"})
    fp16_adam_stats: bool = field(default=False, metadata={"help": "not supported by ls_adam (an error if set)"})
    bf16: bool = II("common.bf16")  # see LSAdam.__init__
    lr: List[float] = II("optimization.lr")


class LSAdam(FairseqOptimizer):
    """fairseq optimizer `ls_adam`: the options of fairseq's `adam`, the fused update (FusedAdam)."""

    def __init__(self, cfg: LSAdamConfig, params):
        super().__init__(cfg)
        reject_amsgrad(getattr(cfg, "amsgrad", False))
        if getattr(cfg, "fp16_adam_stats", False):
            raise ConfigurationError("ls_adam keeps Adam statistics in fp32; --fp16-adam-stats is not supported")
        # fairseq's FP16Optimizer without a loss scaler (--bf16) never resets its multiply factor after a
        # step-with-scale, so the clip factor would compound over steps: under --bf16 let it unscale the
        # grads itself (`_told`).
        self._step_with_scale = not getattr(cfg, "bf16", False)
        # Tensors on a device without a compiled kernel (e.g. XLA) are updated by the reference op
        # (with a one-time warning).
        self._optimizer = self._told(FusedAdam(params, **self.optimizer_config))
        self._pending_factor = 1.0  # fairseq's multiply_grads factor, not yet applied (see below)

    def _told(self, optimizer):
        """`optimizer` (a torch optimizer) told this run's supports_step_with_scale, which fairseq's fp16/bf16
        wrappers read from it."""
        optimizer.supports_step_with_scale = self._step_with_scale
        return optimizer

    @property
    def optimizer(self):
        """The torch optimizer: FusedAdam, or fairscale's OSS holding one (--zero-sharding os)."""
        return FairseqOptimizer.optimizer.fget(self)

    @optimizer.setter
    def optimizer(self, optimizer):
        """fairseq's --zero-sharding os puts fairscale's OSS here, which would answer for the FusedAdam it
        builds from optimizer_config alone (supports_step_with_scale True, also under --bf16)."""
        FairseqOptimizer.optimizer.fset(self, self._told(optimizer))

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

    # ---- the gradient factor, applied inside the update -------------------------------------------
    # fairseq's Trainer multiplies every grad by data_parallel_size / sample_size (multiply_grads), asks
    # for their norm and clips them (clip_grad_norm), then steps; fairseq allows an optimizer to apply
    # that factor on the fly (FP16Optimizer does). ls_adam keeps it pending and hands it to the update
    # kernel as its grad scale, so the two passes over every gradient are not made at all: the norm is
    # the raw grads' norm times the factor. A fallback path below that reads the grads itself gets them
    # multiplied first (_apply_grad_factor); zero_grad and step clear the factor.

    def multiply_grads(self, c):
        """Multiplies the grads by c (float or 0-dim tensor): recorded, applied by step()."""
        self._pending_factor = self._pending_factor * c

    def _apply_grad_factor(self):
        """Multiplies the grads by the pending factor now (for code that reads them directly)."""
        c = self._pending_factor
        self._pending_factor = 1.0
        if torch.is_tensor(c) or c != 1.0:
            super().multiply_grads(c)

    def zero_grad(self):
        """fairseq's zero_grad (grads set to None) in one pass: FairseqOptimizer's also calls the torch
        optimizer's zero_grad, a second loop over every param finding nothing left to clear."""
        self._pending_factor = 1.0
        for group in self._optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self, closure=None, scale=1.0, groups=None):
        """fairseq's step (grads divided by `scale`) with the pending factor folded into that division:
        FusedAdam takes it as the kernel's grad scale (a float) or divides on the device (a tensor, e.g.
        after clipping), whether or not fairseq's wrappers were told it steps with a scale."""
        c = self._pending_factor
        if not torch.is_tensor(c) and c == 0:  # nothing to divide by: zero the grads, as fairseq would
            self._apply_grad_factor()
            c = 1.0
        self._pending_factor = 1.0
        self._optimizer.step(closure, scale=scale / c)

    @torch.no_grad()
    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq's clip_grad_norm_ (the fp32 L2 norm of all grads, aggregated, then the grads scaled by
        min(1, max_norm / (norm + 1e-6)) when max_norm > 0), on the grads times the pending factor: the
        per-tensor norms come from one multi-tensor call instead of one norm op per parameter (fairseq's
        Trainer calls this on every step, with max_norm 0 to log the norm, and its loop is ~250 op calls
        at Transformer-big depth), and the clip coefficient joins the pending factor. Falls back to
        fairseq's own function for what the fast path does not cover (sparse or MoE expert grads, grads
        on several devices, a torch without _foreach_norm's dtype)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if len(grads) < 2 or any(g.is_sparse for g in grads) or len({g.device for g in grads}) > 1 \
                or any(hasattr(p, "expert") for p in self.params):
            self._apply_grad_factor()
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        try:
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        except TypeError:  # torch before _foreach_norm's dtype argument
            self._apply_grad_factor()
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        c = self._pending_factor
        total_norm = torch.linalg.vector_norm(torch.stack(norms))
        total_norm = total_norm * (c.abs() if torch.is_tensor(c) else abs(c))
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            self._pending_factor = c * (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
        return total_norm

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
