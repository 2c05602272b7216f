"""FusedAdam: the torch optimizer behind `--optimizer ls_adam` (ls_adam.py, fairseq's wrapper): fairseq's
Adam update ("AdamW-like" weight decay, fairseq/optim/adam.py) and per-param state (`step` int,
`exp_avg`, `exp_avg_sq` fp32), applied by the fused multi-tensor op (ops.adam_step) in one kernel call
per step and device.
"""
from collections import defaultdict

import torch

from .. import ops
from ..errors import ConfigurationError
from ..ops import adam as adam_ops

_HALF = (torch.float16, torch.bfloat16)


class FusedAdam(torch.optim.Optimizer):
    """Adam as fairseq's `Adam` (same update, same state), applied by the fused multi-tensor op.

    Params may be fp32 (fp32 training, FP16Optimizer's fp32 master params) or fp16/bf16
    (--memory-efficient-fp16/bf16: updated through a temporary fp32 copy as fairseq's adam does);
    grads fp32/fp16/bf16. State per param: `step` (int), `exp_avg`, `exp_avg_sq` (fp32).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        reject_amsgrad(amsgrad)
        if not 0.0 <= lr:
            raise ConfigurationError(f"ls_adam: lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ConfigurationError(f"ls_adam: betas must be in [0, 1), got {betas}")
        if not 0.0 <= eps:
            raise ConfigurationError(f"ls_adam: eps must be >= 0, got {eps}")
        if not 0.0 <= weight_decay:
            raise ConfigurationError(f"ls_adam: weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False))

    # Capabilities fairseq's wrappers query (FP16Optimizer / MemoryEfficientFP16Optimizer).
    supports_memory_efficient_fp16 = True
    supports_flat_params = True
    # step(scale=s) divides the grads by s inside the kernel, so FP16Optimizer can skip its separate
    # unscaling pass over all gradients (whether fairseq uses it is ls_adam's choice: LSAdam).
    supports_step_with_scale = True

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch casts loaded state to each param's dtype (fp16 for --memory-efficient-fp16) and may
        # leave a tensor `step`: the next step brings them back to fp32 / int, once.
        self._state_checked = False
        self._ready = {}

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._ready = {}

    def _ready_group(self, group):
        """The group's (params, states, exp_avgs, exp_avg_sqs) when the previous step found it in the
        common case, which this step can update without looking at each param again: every param
        fp32 with a grad, one step number, all on one device whose kernel takes them. Autograd
        gives each grad its param's shape, dtype and device, so only their presence is checked."""
        ready = getattr(self, "_ready", {}).get(id(group))
        if ready is None or ready[0] is not group["params"]:
            return None
        ps = ready[1]
        gs = [p.grad for p in ps]
        if any(g is None for g in gs):
            return None
        return ps, gs, ready[2], ready[3], ready[4]

    def _remember_group(self, group, buckets, copy_back):
        """Keep the group for _ready_group when this step was the common case."""
        if copy_back or len(buckets) != 1:
            return
        ps, gs, ms, vs = next(iter(buckets.values()))
        if len(ps) != len(group["params"]) or not ps or any(g.is_sparse for g in gs):
            return
        device = ps[0].device
        if not ops.use_kernel("adam_step_", device.type) or not all(
                adam_ops.kernel_accepts(p, g, m, v) and p.device == device for p, g, m, v in zip(ps, gs, ms, vs)):
            return
        if not hasattr(self, "_ready"):
            self._ready = {}
        self._ready[id(group)] = (group["params"], list(ps), [self.state[p] for p in ps], ms, vs)

    @torch.no_grad()
    def step(self, closure=None, scale=1.0):
        """One update of every param with a grad; grads are divided by `scale` (float or 0-dim tensor).

        No host-device sync: a tensor scale (fairseq's FP16Optimizer after gradient clipping) is
        applied to the grads on the device (one multiply over them, as FP16Optimizer itself would
        do) rather than read back as a float for the kernel's grad_scale."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        check_state = not getattr(self, "_state_checked", True)
        for group in self.param_groups:
            reject_amsgrad(group.get("amsgrad", False))
            beta1, beta2 = group["betas"]
            ready = None if check_state else self._ready_group(group)
            if ready is not None:  # the common case: one kernel call, no per-param work but `step`
                ps, gs, states, ms, vs = ready
                step = states[0]["step"] + 1
                for st in states:
                    st["step"] = step
                adam_ops.adam_step_unchecked(ps, gs, ms, vs, step, group["lr"], beta1, beta2, group["eps"],
                                             group["weight_decay"], _grad_scale(gs, scale))
                continue
            getattr(self, "_ready", {}).pop(id(group), None)  # e.g. a param without a grad: steps now differ
            buckets = defaultdict(lambda: ([], [], [], []))  # by step number (normally one bucket)
            copy_back = []
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("ls_adam does not support sparse gradients")
                half = p.dtype in _HALF
                p32 = p.float() if half else p  # (step runs under no_grad: no `.data` needed)
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p32, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p32, memory_format=torch.contiguous_format)
                elif check_state:
                    # As fairseq: state loaded from a checkpoint may sit on another device/dtype.
                    state["exp_avg"] = state["exp_avg"].to(p32)
                    state["exp_avg_sq"] = state["exp_avg_sq"].to(p32)
                    state["step"] = int(state["step"])
                state["step"] += 1
                lists = buckets[state["step"]]
                for lst, t in zip(lists, (p32, grad, state["exp_avg"], state["exp_avg_sq"])):
                    lst.append(t)
                if half:
                    copy_back.append((p, p32))
            for step, (ps, gs, ms, vs) in buckets.items():
                adam_ops.adam_step(ps, gs, ms, vs, step, group["lr"], beta1, beta2, group["eps"],
                                   group["weight_decay"], _grad_scale(gs, scale))
            for p, p32 in copy_back:
                p.copy_(p32)
            self._remember_group(group, buckets, copy_back)
        self._state_checked = True
        return loss


def _grad_scale(grads, scale) -> float:
    """The kernel's grad_scale for dividing `grads` by `scale`. A tensor scale on the grads' device
    divides them there (no sync: its value never comes to the host) and leaves 1.0; a float, or a
    CPU tensor beside device grads (its value is already on the host), gives 1 / scale."""
    if not torch.is_tensor(scale):
        return 1.0 / scale
    if scale.device.type == "cpu" and grads[0].device.type != "cpu":
        return 1.0 / float(scale)
    torch._foreach_div_(grads, scale)
    return 1.0


def reject_amsgrad(amsgrad) -> None:
    """ConfigurationError for amsgrad=True, which the fused update does not implement."""
    if amsgrad:
        raise ConfigurationError("ls_adam does not implement amsgrad=True; use --optimizer adam for AMSGrad")
