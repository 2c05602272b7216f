"""`with probe() as seen:` around a fairseq-train run in this process (support.cli.run) records, for
every update, what the Trainer trains: seen = [{"params": sorted parameter dtypes, "device": the
parameters' device type}]. Checkpoints cannot show this: fairseq saves every fp16/bf16 tensor as fp32
(utils.move_to_cpu)."""
import contextlib

from fairseq.trainer import Trainer


@contextlib.contextmanager
def probe():
    seen = []
    train_step = Trainer.train_step

    def probed(self, samples, raise_oom=False):
        out = train_step(self, samples, raise_oom)
        params = list(self.model.parameters())
        seen.append({"params": sorted({str(p.dtype) for p in params}), "device": params[0].device.type})
        return out

    Trainer.train_step = probed
    try:
        yield seen
    finally:
        Trainer.train_step = train_step
