"""`python -m support.probe_train PROBE.json ARGS...` runs fairseq-train's own entry point
(`fairseq_cli.train.cli_main`, which the fairseq-train console script calls) on ARGS, and writes to
PROBE.json, for every update, what the Trainer trains: [{"params": sorted parameter dtypes,
"device": the parameters' device type}]. Checkpoints cannot show this: fairseq saves every fp16/bf16
tensor as fp32 (utils.move_to_cpu)."""
import json
import sys

from fairseq_cli.train import cli_main  # first: it sets up fairseq's log format
from fairseq.trainer import Trainer


def main():
    probe_path = sys.argv.pop(1)
    seen = []
    train_step = Trainer.train_step

    def probed(self, samples, raise_oom=False):
        out = train_step(self, samples, raise_oom)
        params = list(self.model.parameters())
        seen.append({"params": sorted({str(p.dtype) for p in params}), "device": params[0].device.type})
        return out

    Trainer.train_step = probed
    try:
        cli_main()
    finally:
        with open(probe_path, "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    main()
