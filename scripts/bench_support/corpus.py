"""A WMT-like synthetic data-bin written directly in fairseq's mmap format, cached; and the fixed pool
of batches drawn from fairseq's own loader.

The corpus: `n_pairs` sentence pairs of word ids with Zipf-like frequencies (p(rank) ~ 1/(rank+10)),
source lengths log-normal around 24 words (sigma 0.5, clipped to [1, 200]; mean about 27 as WMT'14
en-de after BPE), target length = source length x lognormal(0, 0.1), each sentence ending in </s> as
fairseq's binarizer writes it. One dictionary of `vocab` entries (fairseq's 4 specials + words) serves
both languages (--share-all-embeddings). Written with numpy and fairseq's own index writer: a 1M-pair
corpus takes seconds, where fairseq-preprocess would take many minutes.
"""
import os
import shutil

import numpy as np


def _write_split(prefix: str, lengths: np.ndarray, cum: np.ndarray, rng) -> None:
    """prefix.bin/.idx: one uint16 sentence per length (words drawn from cum, then </s> = 2)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    sizes = (lengths + 1).astype(np.int64)
    with open(prefix + ".bin", "wb") as f:
        for lo in range(0, len(lengths), 100_000):  # chunks keep the float draws small
            n = sizes[lo:lo + 100_000]
            ids = (4 + np.searchsorted(cum, rng.random(int(n.sum())) * cum[-1])).astype(np.uint16)
            ends = np.cumsum(n) - 1
            ids[ends] = 2  # </s>
            f.write(ids.tobytes())
    with MMapIndexedDataset.Index.writer(prefix + ".idx", np.uint16) as w:
        w.write(sizes.tolist())


def synthetic_data_bin(cache_dir: str, n_pairs: int, vocab: int = 32000, seed: int = 0) -> str:
    """Path of the cached data-bin (made on first use; a half-written one is never reused)."""
    if vocab > 65000 or vocab < 8:
        raise ValueError(f"--vocab {vocab}: must be in [8, 65000] (uint16 token ids)")
    d = os.path.join(os.path.abspath(cache_dir), f"wmtlike-{n_pairs}pairs-{vocab}vocab-seed{seed}")
    if os.path.exists(os.path.join(d, "complete")):
        return d
    tmp = f"{d}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(seed)
    words = vocab - 4
    p = 1.0 / (np.arange(words) + 10.0)
    cum = np.cumsum(p)
    with open(os.path.join(tmp, "dict.src.txt"), "w") as f:
        f.writelines(f"w{i} {int(1e9 * p[i] / cum[-1]) + 1}\n" for i in range(words))
    shutil.copy(os.path.join(tmp, "dict.src.txt"), os.path.join(tmp, "dict.tgt.txt"))
    for split, n in (("train", n_pairs), ("valid", 200)):
        src = np.clip(rng.lognormal(np.log(24), 0.5, n), 1, 200)
        tgt = np.clip((src * rng.lognormal(0.0, 0.1, n)).astype(np.int64), 1, 200)
        src = src.astype(np.int64)
        for lang, lengths in (("src", src), ("tgt", tgt)):
            _write_split(os.path.join(tmp, f"{split}.src-tgt.{lang}"), lengths, cum, rng)
    open(os.path.join(tmp, "complete"), "w").close()
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    return d


def draw_pool(args_list, n: int):
    """The first n batches of fairseq's own training loader (task.get_batch_iterator, shuffled with
    --seed, epoch 1) for these fairseq-train arguments, as CPU tensors; cycled if the split has fewer."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=args_list)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset), max_tokens=cfg.dataset.max_tokens,
        max_positions=(cfg.task.max_source_positions, cfg.task.max_target_positions),
        ignore_invalid_inputs=True, required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, num_workers=0, epoch=1).next_epoch_itr(shuffle=True)
    pool = []
    for s in itr:
        pool.append(s)
        if len(pool) == n:
            break
    return [pool[i % len(pool)] for i in range(n)]


def pad_fraction(pool, pad: int = 1) -> dict:
    """Padding share of the token slots the model computes: src [B, S_max] and tgt [B, T_max]."""
    src_slots = sum(s["net_input"]["src_tokens"].numel() for s in pool)
    tgt_slots = sum(s["target"].numel() for s in pool)
    src_real = sum(int(s["net_input"]["src_lengths"].sum()) for s in pool)
    tgt_real = sum(int((s["target"] != pad).sum()) for s in pool)
    return {"src": 1 - src_real / src_slots, "tgt": 1 - tgt_real / tgt_slots,
            "all": 1 - (src_real + tgt_real) / (src_slots + tgt_slots)}
