"""Synthetic data-bins, cached: a WMT-like translation corpus written directly in fairseq's mmap
format, and a language-model corpus of the same words binarized by fairseq-preprocess; and the fixed
pool of batches drawn from fairseq's own loader (any task: translation's sentence buckets, the LM's
blocks of --tokens-per-sample tokens).

The corpus: `n_pairs` sentence pairs of word ids with Zipf-like frequencies (p(rank) ~ 1/(rank+10)),
source lengths log-normal around 24 words (sigma 0.5, clipped to [1, 200]; mean about 27 as WMT'14
en-de after BPE), target length = source length x lognormal(0, 0.1), each sentence ending in </s> as
fairseq's binarizer writes it. One dictionary of `vocab` entries (fairseq's 4 specials + words) serves
both languages (--share-all-embeddings). Written with numpy and fairseq's own index writer: a 1M-pair
corpus takes seconds, where fairseq-preprocess would take many minutes. The LM corpus
(synthetic_lm_data_bin) is smaller (200k lines, ~5.4M tokens, by default) and goes through
fairseq-preprocess --only-source as users prepare one.
"""
import os
import shutil

import numpy as np


def _draw_words(sizes: np.ndarray, cum: np.ndarray, rng):
    """Chunks of (word indices 0.., sentence sizes): sum(sizes) indices drawn from cum (chunks keep the
    float draws small)."""
    for lo in range(0, len(sizes), 100_000):
        n = sizes[lo:lo + 100_000]
        yield np.searchsorted(cum, rng.random(int(n.sum())) * cum[-1]), n


def _write_split(prefix: str, lengths: np.ndarray, cum: np.ndarray, rng) -> None:
    """prefix.bin/.idx: one uint16 sentence per length (words drawn from cum, then </s> = 2)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    sizes = (lengths + 1).astype(np.int64)
    with open(prefix + ".bin", "wb") as f:
        for words, n in _draw_words(sizes, cum, rng):
            ids = (4 + words).astype(np.uint16)
            ids[np.cumsum(n) - 1] = 2  # </s>
            f.write(ids.tobytes())
    with MMapIndexedDataset.Index.writer(prefix + ".idx", np.uint16) as w:
        w.write(sizes.tolist())


def _zipf(vocab: int):
    """(p, cum) of the corpus' words: p(rank) ~ 1/(rank+10) over the vocab - 4 non-special entries."""
    if vocab > 65000 or vocab < 8:
        raise ValueError(f"--vocab {vocab}: must be in [8, 65000] (uint16 token ids)")
    p = 1.0 / (np.arange(vocab - 4) + 10.0)
    return p, np.cumsum(p)


def _write_dict(path: str, p: np.ndarray, cum: np.ndarray) -> None:
    with open(path, "w") as f:
        f.writelines(f"w{i} {int(1e9 * p[i] / cum[-1]) + 1}\n" for i in range(len(p)))


def _lengths(rng, n: int) -> np.ndarray:
    """Sentence lengths in words: log-normal around 24 (sigma 0.5), clipped to [1, 200]."""
    return np.clip(rng.lognormal(np.log(24), 0.5, n), 1, 200)


def cached(cache_dir: str, name: str, make) -> str:
    """cache_dir/name, made by make(tmp_dir) on first use; a half-written one is never reused."""
    d = os.path.join(os.path.abspath(cache_dir), name)
    if os.path.exists(os.path.join(d, "complete")):
        return d
    tmp = f"{d}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    make(tmp)
    open(os.path.join(tmp, "complete"), "w").close()
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    return d


def synthetic_data_bin(cache_dir: str, n_pairs: int, vocab: int = 32000, seed: int = 0) -> str:
    """Path of the cached translation data-bin (made on first use)."""
    p, cum = _zipf(vocab)

    def make(tmp):
        rng = np.random.default_rng(seed)
        _write_dict(os.path.join(tmp, "dict.src.txt"), p, cum)
        shutil.copy(os.path.join(tmp, "dict.src.txt"), os.path.join(tmp, "dict.tgt.txt"))
        for split, n in (("train", n_pairs), ("valid", 200)):
            src = _lengths(rng, n)
            tgt = np.clip((src * rng.lognormal(0.0, 0.1, n)).astype(np.int64), 1, 200)
            src = src.astype(np.int64)
            for lang, lengths in (("src", src), ("tgt", tgt)):
                _write_split(os.path.join(tmp, f"{split}.src-tgt.{lang}"), lengths, cum, rng)

    return cached(cache_dir, f"wmtlike-{n_pairs}pairs-{vocab}vocab-seed{seed}", make)


def synthetic_lm_data_bin(cache_dir: str, n_lines: int, vocab: int = 50264, seed: int = 0) -> str:
    """Path of the cached language-model data-bin (made on first use): n_lines lines of the same
    Zipf-like words and sentence lengths as the translation corpus' source side, written as text and
    binarized by fairseq-preprocess --only-source with the fixed dictionary (--srcdict), as a user
    prepares an LM corpus; about 27 tokens a line (the line's </s> included)."""
    import subprocess
    import sys

    p, cum = _zipf(vocab)

    def make(tmp):
        rng = np.random.default_rng(seed)
        names = np.array([f"w{i}" for i in range(len(p))])
        _write_dict(os.path.join(tmp, "dict.txt"), p, cum)
        for split, n in (("train", n_lines), ("valid", 200)):
            with open(os.path.join(tmp, f"{split}.txt"), "w") as f:
                for words, sizes in _draw_words(_lengths(rng, n).astype(np.int64), cum, rng):
                    lines = np.split(names[words], np.cumsum(sizes)[:-1])
                    f.writelines(" ".join(line) + "\n" for line in lines)
        r = subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--srcdict",
                            os.path.join(tmp, "dict.txt"), "--trainpref", os.path.join(tmp, "train.txt"),
                            "--validpref", os.path.join(tmp, "valid.txt"), "--destdir", tmp,
                            "--dataset-impl", "mmap", "--workers", str(min(os.cpu_count() or 1, 8))],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"fairseq-preprocess failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        for split in ("train", "valid"):
            os.remove(os.path.join(tmp, f"{split}.txt"))

    return cached(cache_dir, f"lm-{n_lines}lines-{vocab}vocab-seed{seed}", make)


def draw_pool(args_list, n: int):
    """The first n batches of fairseq's own training loader (task.get_batch_iterator with --max-tokens and
    --batch-size, shuffled with --seed, epoch 1) for these fairseq-train arguments, as CPU tensors; cycled
    if the split has fewer."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=args_list)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=task.max_positions(), ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, num_workers=0, epoch=1).next_epoch_itr(shuffle=True)
    pool = []
    for s in itr:
        pool.append(s)
        if len(pool) == n:
            break
    return [pool[i % len(pool)] for i in range(n)]


def pad_fraction(pool, pad: int = 1, masked: bool = False) -> dict:
    """Padding share of the token slots the model computes: src [B, S_max] and tgt [B, T_max]. With
    masked targets (masked_lm: pad except at the masked positions) the target has no padding of its
    own: tgt is None, all is the source's, and masked is the share of real source tokens masked."""
    src_slots = sum(s["net_input"]["src_tokens"].numel() for s in pool)
    src_real = sum(int(s["net_input"]["src_lengths"].sum()) for s in pool)
    tgt_real = sum(int((s["target"] != pad).sum()) for s in pool)
    if masked:
        return {"src": 1 - src_real / src_slots, "tgt": None, "all": 1 - src_real / src_slots,
                "masked": tgt_real / src_real}
    tgt_slots = sum(s["target"].numel() for s in pool)
    return {"src": 1 - src_real / src_slots, "tgt": 1 - tgt_real / tgt_slots,
            "all": 1 - (src_real + tgt_real) / (src_slots + tgt_slots)}
