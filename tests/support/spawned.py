"""A rank that refuses as the plugin does at model build, started by torch.multiprocessing.spawn as fairseq's
call_main starts its ranks on GPUs (fairseq's own spawn: GPU runs without --distributed-no-spawn or torchrun).
`python -m support.spawned` (from tests/) is the parent: the plugin imported, one rank spawned."""
import torch.multiprocessing as mp

import fairseq_lightseq  # noqa: F401  (the plugin's exception hook, as --user-dir installs it)
from fairseq_lightseq.errors import ConfigurationError

MESSAGE = "ls_transformer: --some-option 1 is refused in a spawned rank"


def refuse(rank: int) -> None:
    raise ConfigurationError(MESSAGE)


if __name__ == "__main__":
    mp.spawn(refuse, nprocs=1, join=True)
