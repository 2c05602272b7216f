"""fairseq's two engines from fairscale, `--ddp-backend fully_sharded` (FSDP: parameters, gradients and
optimizer state sharded) and `--zero-sharding os` (ZeRO-1: the optimizer state sharded), refused with one
line before fairseq-train reaches fairscale when the run cannot have them.

Where: fairseq-train imports fairscale for fully_sharded (`fsdp_enable_wrap`) before it builds the model, so
a refusal at model build comes too late: without fairscale the run ends in fairseq's ImportError traceback
instead. `check` runs in the plugin's wrapper of `call_main` (patches/cli_config.py), before the training
command's main, in that order:

1. `--sequence-parallel-size` > 1 with fully_sharded: sequence parallelism's own refusal
   (sequence_parallel.options.check_ddp_backend, which the model build also runs);
2. fully_sharded on a CPU run (`--cpu`, or no CUDA device): fairscale 0.4.13's FullyShardedDataParallel
   runs only on CUDA. fairseq hands it no compute device, so it takes `cuda` and stops in its constructor
   with "Torch not compiled with CUDA enabled"; given the CPU as its compute device it stops in its first
   forward, which gathers the parameters on a CUDA stream it never made on the CPU (KeyError 'all_gather').
   ZeRO-1 runs on the CPU (`--ddp-backend legacy_ddp --zero-sharding os`);
3. either engine without fairscale installed (`make setup` installs it).
"""
import torch

from ..errors import ConfigurationError

FAIRSCALE = "fairscale==0.4.13"  # the version make setup installs and the tests run


def engine(cfg):
    """The fairscale engine `cfg` (fairseq's config) asks for, as its option, or None."""
    dt = cfg.distributed_training
    if dt.ddp_backend == "fully_sharded":
        return "--ddp-backend fully_sharded"
    if dt.zero_sharding == "os":
        return "--zero-sharding os"
    return None


def check(cfg) -> None:
    """Raise ConfigurationError naming the option when the training run `cfg` asks for a fairscale engine
    it cannot have (module docstring)."""
    option = engine(cfg)
    if option is None:
        return
    if option.startswith("--ddp-backend"):
        from ..sequence_parallel import options  # imported by the call: patches install before the models

        options.check_ddp_backend(cfg.model, cfg.distributed_training.ddp_backend)
        if cfg.common.cpu or not torch.cuda.is_available():
            raise ConfigurationError("--ddp-backend fully_sharded needs CUDA: fairscale's FullyShardedDataParallel "
                                     "does not run on the CPU; there, --zero-sharding os shards the optimizer state")
    try:
        import fairscale  # noqa: F401
    except ImportError:
        raise ConfigurationError(f"{option} needs the fairscale package: pip install {FAIRSCALE} "
                                 "(make setup installs it)") from None
