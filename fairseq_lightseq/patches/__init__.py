"""Every fix the plugin makes to fairseq, torch or numpy when it is imported (`--user-dir
fairseq_lightseq`), applied by `install()` in this order:

1. `requirements`: fairseq 0.12 is there (first, so that a missing fairseq gives one clear error
   before any other module imports it);
2. `numpy_compat`: fairseq's `np.compat.long` under numpy 2;
3. `checkpoints.safety.register`: torch's weights_only loader reads fairseq checkpoints (the
   allowlist is checkpoint code, kept with it; registering it is torch's own API);
4. `checkpoint_io`: clear errors for unreadable checkpoints, atomic copies;
5. `cli_config`: `--bf16` without `--tpu`, `--fp16` and torchrun on the CPU, and (`fairscale_engines`) the
   refusals of fairscale's engines before fairseq-train imports fairscale;
6. `cpu_ddp`: `--ddp-backend pytorch_ddp` on the CPU;
7. `clean_exit`: fairseq's data-buffer threads stopped before exit;
8. `refusal_exit`: the plugin's refusals (errors.Refusal) end a command with their message alone, exit 1;
9. `batch_seeds`: an ls_* model's dropout masks do not depend on how an update's batches are split over
   ranks and --update-freq steps;
10. `pretrained_bart_task`: `--task translation_from_pretrained_bart` runs (and checks --langs);
11. `resume_batches`: a run resumed in epoch 2 or later trains on the batches of the run it continues;
12. `denoising_noise`: BART's denoising noise drawn from each example's seed, so that a resumed run noises
    its batches as the uninterrupted run does.

Each module says the defect it fixes and has an idempotent `install()`; every attribute they replace
goes through `wrap.wrap` / `wrap.replace` (which record it in `wrap.PATCHED`). The modules are imported
by `install()`, not here, so that importing this package (for `wrap`) imports no fairseq before the
requirements check.
"""
import importlib

__all__ = ["ORDER", "install"]

# (module, function) applied by install(), in order
ORDER = (
    ("fairseq_lightseq.patches.requirements", "install"),
    ("fairseq_lightseq.patches.numpy_compat", "install"),
    ("fairseq_lightseq.checkpoints.safety", "register"),
    ("fairseq_lightseq.patches.checkpoint_io", "install"),
    ("fairseq_lightseq.patches.cli_config", "install"),
    ("fairseq_lightseq.patches.cpu_ddp", "install"),
    ("fairseq_lightseq.patches.clean_exit", "install"),
    ("fairseq_lightseq.patches.refusal_exit", "install"),
    ("fairseq_lightseq.patches.batch_seeds", "install"),
    ("fairseq_lightseq.patches.pretrained_bart_task", "install"),
    ("fairseq_lightseq.patches.resume_batches", "install"),
    ("fairseq_lightseq.patches.denoising_noise", "install"),
)


def install() -> None:
    """Applies every patch of ORDER (idempotent)."""
    for module, function in ORDER:
        getattr(importlib.import_module(module), function)()
