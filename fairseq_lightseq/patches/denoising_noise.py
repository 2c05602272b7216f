"""BART's denoising noise drawn from its example's own seed, so that a resumed run noises its batches as the
uninterrupted run does.

The defect (fairseq's): `DenoisingDataset.__getitem__` (tasks denoising and multilingual_denoising) seeds
numpy with (--seed, epoch, index) for each example, but part of its noise (the span lengths of
--mask-length span-poisson, which words are masked, the random tokens, permuted sentences, insertions) is
drawn from torch's global generator, in whatever state the process left it: in a run, the state the trainer
seeded for the previous update plus what that update drew. A resumed process builds its first batch from the
state that building the model and loading the checkpoint left, i.e. other noise: a resumed BART run departs
from the uninterrupted one at its first update, in any epoch.

The fix: `DenoisingDataset.__getitem__` is wrapped. In the main thread of its process (the training loop
with --data-buffer-size 0, or a DataLoader worker), torch's CPU generator is seeded from (--seed, epoch,
index) while the example is noised (a stream apart from numpy's: the same seed would give both generators
the same numbers) and gets its own state back afterwards: the noise is a function of the example and the
epoch alone, and what the trainer draws is untouched. In fairseq's data-buffer thread (--data-buffer-size
> 0, fairseq's default) the noise is drawn as fairseq draws it: that thread shares the generator with the
training thread, so seeding it there would replay the training thread's numbers; such a run depends on
thread timing, as it did (docs/usage.md: `--data-buffer-size 0` makes a BART run repeatable).
"""
import threading

import torch
from fairseq.data.denoising_dataset import DenoisingDataset

from .wrap import wrap

_STREAM = 1  # what sets the example's torch seed apart from its numpy seed, hash((seed, epoch, index))


def example_seed(seed: int, epoch: int, index: int) -> int:
    """The torch seed of example `index` in `epoch` (a non-negative 63-bit int)."""
    return hash((seed, epoch, index, _STREAM)) & (2 ** 63 - 1)


def _wrap_getitem(getitem):
    def seeded_getitem(self, index):
        if threading.current_thread() is not threading.main_thread():
            return getitem(self, index)
        state = torch.get_rng_state()
        torch.default_generator.manual_seed(example_seed(self.seed, self.epoch, index))
        try:
            return getitem(self, index)
        finally:
            torch.set_rng_state(state)
    return seeded_getitem


def install() -> None:
    """Wraps fairseq's DenoisingDataset.__getitem__ (idempotent)."""
    wrap(DenoisingDataset, "__getitem__", _wrap_getitem)
