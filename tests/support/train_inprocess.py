"""fairseq-train in this process: fairseq_cli.train.main on fairseq's own parser and config conversion
(what its cli_main does, without reading sys.argv), returning every update's training loss unrounded
(fairseq's log rounds it to 3 decimals). No process start-up: a tiny run costs its updates only."""
from typing import List

import torch
from fairseq_cli import train as fairseq_train  # first: it sets up fairseq's log format

from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from fairseq.trainer import Trainer


def train_losses(argv: List[str]) -> List[float]:
    """Runs fairseq-train `argv` (one process: add --cpu) on one thread, as the command-line tests run
    (OMP_NUM_THREADS=1: two threads on 2 shared cores stall), and returns the loss of each update: the
    `train_inner` loss meter's exact average right after the update (the value fairseq logs with
    --log-interval 1, before rounding)."""
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    if cfg.common.log_interval != 1:
        raise ValueError("train_losses reads the per-update meter: pass --log-interval 1")
    losses = []
    train_step = Trainer.train_step

    def recorded(self, samples, raise_oom=False):
        out = train_step(self, samples, raise_oom)
        losses.append(float(metrics.get_meter("train_inner", "loss").avg))
        return out

    threads = torch.get_num_threads()
    Trainer.train_step = recorded
    torch.set_num_threads(1)
    try:
        distributed_utils.call_main(cfg, fairseq_train.main)
    finally:
        Trainer.train_step = train_step
        torch.set_num_threads(threads)
    return losses
