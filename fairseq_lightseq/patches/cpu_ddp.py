"""`--ddp-backend pytorch_ddp` (alias `c10d`) on the CPU.

fairseq's `DistributedFairseqModel` builds torch's DistributedDataParallel with
`device_ids=[device_id], output_device=device_id` whatever the device; torch refuses both for a module
on the CPU ("device_ids ... only work with single-device/multiple-device GPU modules"). We replace
the class fairseq builds (`fairseq.models.distributed_fairseq_model.DistributedDataParallel`, looked up
when the Trainer wraps the model) by a subclass that drops the two arguments for a CPU module, as
torch asks; a CUDA module gets them unchanged.
"""
from fairseq.models import distributed_fairseq_model
from torch.nn.parallel import DistributedDataParallel

from .wrap import replace


class DeviceAwareDDP(DistributedDataParallel):
    """torch's DistributedDataParallel; `device_ids`/`output_device` left out for a CPU module."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


def install() -> None:
    """Makes fairseq's DistributedFairseqModel build DeviceAwareDDP (idempotent)."""
    replace(distributed_fairseq_model, "DistributedDataParallel", DeviceAwareDDP)
