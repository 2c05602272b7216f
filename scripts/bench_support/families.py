"""The benchmark's one extension point: a table of model families (`benchmark.py --family NAME`).

Each entry says what differs between families and nothing else; the modes in benchmark.py, the
sides (sides.py), the pools (corpus.py), the timing (timing.py), saved bytes and FLOPs are one code
path for all of them. A family's models, task and criterion pair come from fairseq_lightseq's own
table (fairseq_lightseq/models/families.py, `library`); the rest is the benchmark's:

    library     key in fairseq_lightseq.families.FAMILIES (task, ls_/fairseq model names, criterion pair)
    archs       --arch-size -> fairseq's arch name (the ls side runs its ls_ twin)
    stacks      the model's layer stacks ("encoder", "decoder"): --layers and the tiny width set each
    embed_dims  options that must follow the embedding width when the tiny width sets it (fairseq's
                transformer_lm takes --decoder-input-dim / --decoder-output-dim from its dataclass, 512,
                not from --decoder-embed-dim, and would add projections)
    task_args   fairseq-train arguments of this family that every side gets (--task comes from `library`)
    seq_len     None: batches are length-bucketed sentences (--max-tokens only); "tokens-per-sample":
                batches are blocks of T tokens (--seq-len T, the LM's --tokens-per-sample, break mode none)
    data_bin    (cache_dir, n, vocab) -> data-bin path, the synthetic corpus (corpus.py)
    defaults    per mode and device: arch size, layers, max-tokens, seq-len, precision, corpus size, ...
    tokens      what a batch's ntokens counts, i.e. the tokens of the reported tokens/s (the task's own
                count: fairseq's translation and language_modeling count target tokens, masked_lm every
                input token, masked or not, the usual pretraining figure)
    masked      the targets are pad except at the masked positions (masked_lm): the pad fraction is the
                source's, with the masked share of the real tokens next to it; the LM head's FLOPs are
                counted on the masked rows only (the rows both sides project)
"""
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from .corpus import synthetic_data_bin, synthetic_lm_data_bin


class BenchFamily(NamedTuple):
    library: str
    archs: Dict[str, str]
    stacks: Tuple[str, ...]
    embed_dims: Tuple[str, ...]
    task_args: Tuple[str, ...]
    seq_len: Optional[str]
    data_bin: Callable[[str, int, int], str]
    defaults: dict
    tokens: str = "target tokens"
    masked: bool = False


TINY = {"embed-dim": 32, "ffn-embed-dim": 64, "attention-heads": 2}  # --host-overhead's width

FAMILIES = {
    "translation": BenchFamily(
        library="translation",
        archs={"base": "transformer_wmt_en_de", "big": "transformer_vaswani_wmt_en_de_big"},
        stacks=("encoder", "decoder"),
        embed_dims=(),
        task_args=("--share-all-embeddings", "--label-smoothing", "0.1"),
        seq_len=None,
        data_bin=synthetic_data_bin,
        defaults={
            "corpus": 1_000_000, "vocab": 32000,
            "cpu": {"arch_size": "base", "layers": 2, "max_tokens": [1024], "precision": ["fp32"]},
            "cuda": {"arch_size": "big", "layers": None, "max_tokens": [8192], "precision": ["fp16"],
                     "sweep": [4096, 8192, 16384, 32768], "memory_at": [8192, 32768]},
            "host": {"arch_size": "big", "layers": None, "max_tokens": [512]},
            "act": {"sizes": ["base", "big"], "layers": None, "max_tokens": [4096]},
        }),
    "lm": BenchFamily(
        library="language_model",
        # gpt2_small: fairseq's transformer_lm_gpt = GPT-2 small's widths (d 768, FFN 3072, 12 heads,
        # 12 layers, GELU); fairseq's own "transformer_lm_gpt2_small" is GPT-2 medium's shape (d 1024, 24 layers)
        archs={"base": "transformer_lm", "gpt2_small": "transformer_lm_gpt"},
        stacks=("decoder",),
        embed_dims=("decoder-input-dim", "decoder-output-dim"),
        task_args=("--sample-break-mode", "none", "--share-decoder-input-output-embed"),
        seq_len="tokens-per-sample",
        data_bin=synthetic_lm_data_bin,
        defaults={
            "corpus": 200_000, "vocab": 50264,  # GPT-2's 50257 entries, padded to a multiple of 8 as fairseq does
            "cpu": {"arch_size": "base", "layers": 4, "max_tokens": [1024], "seq_len": [512],
                    "precision": ["fp32"]},
            "cuda": {"arch_size": "gpt2_small", "layers": None, "max_tokens": [16384], "seq_len": [1024, 4096],
                     "precision": ["bf16"], "sweep": [8192, 16384, 32768], "memory_at": [16384]},
            "host": {"arch_size": "gpt2_small", "layers": None, "max_tokens": [512], "seq_len": [128]},
            "act": {"sizes": ["base", "gpt2_small"], "layers": None, "max_tokens": [2048], "seq_len": [512, 2048]},
        }),
    # RoBERTa pretraining: ls_roberta_* + ls_masked_lm vs roberta_* + masked_lm on the LM's synthetic corpus
    # (the masked_lm task adds <mask> to its dictionary and masks 15% of the tokens, 80/10/10, seeded).
    # Blocks of exactly T tokens (break mode none: T - 1 corpus tokens and <s>), so every batch has one
    # shape; fairseq's RoBERTa recipe breaks at sentence ends (complete), which pads the blocks instead.
    "roberta": BenchFamily(
        library="masked_lm",
        archs={"base": "roberta_base", "large": "roberta_large"},
        stacks=("encoder",),
        embed_dims=(),
        task_args=("--sample-break-mode", "none"),
        seq_len="tokens-per-sample",
        data_bin=synthetic_lm_data_bin,
        defaults={
            "corpus": 200_000, "vocab": 50264,  # + <mask> = RoBERTa's 50265 entries
            "cpu": {"arch_size": "base", "layers": 4, "max_tokens": [1024], "seq_len": [512],
                    "precision": ["fp32"]},
            "cuda": {"arch_size": "base", "layers": None, "max_tokens": [16384], "seq_len": [512],
                     "precision": ["bf16"], "sweep": [8192, 16384, 32768], "memory_at": [16384]},
            "host": {"arch_size": "base", "layers": None, "max_tokens": [512], "seq_len": [128]},
            "act": {"sizes": ["base", "large"], "layers": None, "max_tokens": [2048], "seq_len": [512]},
        },
        tokens="input tokens (all, masked or not)",
        masked=True),
    # BART pretraining: ls_bart_* + ls_label_smoothed_cross_entropy vs bart_* + label_smoothed_cross_entropy
    # (fairseq's denoising task with BART's noise: 30% of the words in Poisson(3.5) spans, one <mask> a span,
    # 10% random tokens) on the LM's synthetic corpus, blocks of T tokens (break mode none). The noise draws
    # from torch's generator while fairseq builds a batch, so the two sides' batches differ in their masks,
    # not in their shapes.
    "bart": BenchFamily(
        library="bart",
        archs={"base": "bart_base", "large": "bart_large"},
        stacks=("encoder", "decoder"),
        embed_dims=(),
        task_args=("--sample-break-mode", "none", "--mask", "0.3", "--mask-random", "0.1", "--poisson-lambda",
                   "3.5", "--mask-length", "span-poisson", "--replace-length", "1", "--rotate", "0",
                   "--permute-sentences", "0", "--label-smoothing", "0.1"),
        seq_len="tokens-per-sample",
        data_bin=synthetic_lm_data_bin,
        defaults={
            "corpus": 200_000, "vocab": 50264,  # + <mask> = BART's 50265 entries
            "cpu": {"arch_size": "base", "layers": 2, "max_tokens": [1024], "seq_len": [512],
                    "precision": ["fp32"]},
            "cuda": {"arch_size": "base", "layers": None, "max_tokens": [16384], "seq_len": [512],
                     "precision": ["bf16"], "sweep": [8192, 16384, 32768], "memory_at": [16384]},
            "host": {"arch_size": "base", "layers": None, "max_tokens": [512], "seq_len": [128]},
            "act": {"sizes": ["base", "large"], "layers": None, "max_tokens": [2048], "seq_len": [512]},
        }),
}


def family_names():
    return list(FAMILIES)


def layer_args(family: BenchFamily, layers) -> list:
    """--encoder-layers N --decoder-layers N (the family's stacks); [] for the arch's own depth."""
    return [a for s in family.stacks for a in (f"--{s}-layers", str(layers))] if layers else []


def tiny_width_args(family: BenchFamily) -> list:
    """d=32, FFN 64, 2 heads in every stack of the family (the --host-overhead width)."""
    return ([a for s in family.stacks for k, v in TINY.items() for a in (f"--{s}-{k}", str(v))]
            + [a for k in family.embed_dims for a in (f"--{k}", str(TINY["embed-dim"]))])


def shape_args(family: BenchFamily, max_tokens: int, seq_len=None) -> list:
    """The batch-shape arguments of one pool: --max-tokens, and the block length for a block-batched family."""
    args = ["--max-tokens", str(max_tokens)]
    if family.seq_len:
        args += [f"--{family.seq_len}", str(seq_len)]
    return args


def shape_label(max_tokens: int, seq_len=None) -> str:
    """A pool's key in the results: "1024" (max-tokens) or "1024@T512" (max-tokens at block length T)."""
    return str(max_tokens) if seq_len is None else f"{max_tokens}@T{seq_len}"


def shapes(family: BenchFamily, max_tokens, seq_lens) -> list:
    """[(max_tokens, seq_len)]: every --max-tokens at every --seq-len (seq_len None for translation)."""
    return [(mt, t) for mt in max_tokens for t in (seq_lens if family.seq_len else [None])]
