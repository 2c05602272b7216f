"""`--optimizer bench_fused_adamw`: torch's fused AdamW (torch.optim.AdamW(fused=True)) as a fairseq
optimizer, registered by the benchmark only. It is the fastest Adam fairseq can use without apex, so
the benchmark's second baseline separates what the fused layers gain from what the fused optimizer
gains. With weight_decay 0 (the benchmark's setting) AdamW is Adam. Accepts fairseq adam's options."""
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II


@dataclass
class BenchFusedAdamWConfig(FairseqDataclass):
    adam_betas: Any = field(default="(0.9, 0.999)", metadata={"help": "betas, e.g. '(0.9, 0.98)'"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    lr: List[float] = II("optimization.lr")


class BenchFusedAdamW(FairseqOptimizer):
    def __init__(self, cfg: BenchFusedAdamWConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.AdamW(params, fused=True, **self.optimizer_config)

    @property
    def optimizer_config(self):
        betas = self.cfg.adam_betas
        betas = eval(betas) if isinstance(betas, str) else tuple(betas)  # fairseq adam's string form
        return {"lr": self.cfg.lr[0], "betas": betas, "eps": self.cfg.adam_eps,
                "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self):
        return True  # fairseq's fp16 path hands one flat fp32 tensor; fused AdamW takes it


def register() -> None:
    """Registers the optimizer once (fairseq refuses a second registration of the name)."""
    from fairseq.optim import OPTIMIZER_REGISTRY

    if "bench_fused_adamw" not in OPTIMIZER_REGISTRY:
        register_optimizer("bench_fused_adamw", dataclass=BenchFusedAdamWConfig)(BenchFusedAdamW)
