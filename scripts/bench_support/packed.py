"""benchmark.py --packed: ls_ models with --ls-packed True (the layers compute the batch's real tokens only)
against the same model padded (--ls-packed False) and fairseq's, on real Multi30k batches, plus a
padding sweep on synthetic batches. The method is in benchmark.py's docstring; this module holds the
cases, the synthetic batches, the padding count and the report.

Cases (`--cases`, each one model trained by every side in its own process, its pools timed in turn):
    translation  ls_transformer vs transformer, 3+3 layers, d 256, FFN 1024, 4 heads, one pool per
                 --max-tokens (default 4096 and 16384) from fairseq's translation loader
    sentence     ls_roberta_base vs roberta_base widths (d 768, FFN 3072, 12 heads), 4 layers, fairseq's
                 sentence_prediction task and criterion, --batch-size 32, 2 classes
    lm           ls_transformer_lm vs transformer_lm widths (d 512, FFN 2048, 8 heads), 2 layers,
                 --sample-break-mode eos (one sentence a row), the first --max-tokens
    sweep        the translation model on synthetic B x T batches (--sweep-batch) whose padding share is
                 each of --sweep-pads; ls packed vs ls padded only
"""
import os
from typing import NamedTuple, Optional, Tuple

PACKED_SIDES = ("ls_packed", "ls_padded", "fairseq", "fairseq_fused")
SWEEP_SIDES = ("ls_packed", "ls_padded")
CASES = ("translation", "sentence", "lm", "sweep")
# the benchmark side each runs, and its --ls-packed
SIDE_OF = {"ls_packed": ("ls", "True"), "ls_padded": ("ls", "False"), "fairseq": ("fairseq", None),
           "fairseq_fused": ("fairseq_fused", None)}
TRANSLATION_WIDTH = ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                     "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                     "--decoder-attention-heads", "4"]
LAYERS = {"translation": 3, "sentence": 4, "lm": 2, "sweep": 3}
SENTENCE_BATCH = 32
LM_BLOCK = 256  # --tokens-per-sample: the longest sentence a row may hold (Multi30k's longest: ~45 tokens)
OPS_KEPT = 40  # ops kept per side and pool in the JSON, by self CPU time
TARGETS = {"translation@4096": 1.05, "translation@16384": 1.10, "sentence": 1.5, "lm": 1.10}


class Case(NamedTuple):
    """One model of the mode. pools: [(label, shape)]: shape (max_tokens, block length or None) for the
    families' loaders, or a padding share for the sweep's synthetic batches."""

    name: str
    family: Optional[str]  # bench_support.families key (None: sentence_prediction, built here)
    data_bin: str
    layers: int
    pools: Tuple


def cases(a, bins) -> list:
    """The Cases of --cases (a: benchmark.py's parsed arguments; bins: multi30k.data_bins)."""
    layers = {k: a.layers or v for k, v in LAYERS.items()}
    table = {
        "translation": Case("translation", "translation", bins["translation"], layers["translation"],
                            tuple((f"translation@{mt}", (mt, None)) for mt in a.max_tokens)),
        "sentence": Case("sentence", None, bins["sentence"], layers["sentence"],
                         (("sentence", (None, None)),)),
        "lm": Case("lm", "lm", bins["lm"], layers["lm"], (("lm", (a.max_tokens[0], LM_BLOCK)),)),
        "sweep": Case("sweep", "translation", bins["translation"], layers["sweep"],
                      tuple((f"pad{p:.2f}", p) for p in a.sweep_pads)),
    }
    return [table[c] for c in a.cases]


def width_args(a, case: Case) -> list:
    """The case's widths: its own, or d 32 / FFN 64 / 2 heads with --tiny (families.tiny_width_args)."""
    from .families import FAMILIES, tiny_width_args

    if a.tiny:
        return tiny_width_args(FAMILIES[case.family or "roberta"])
    return TRANSLATION_WIDTH if case.family == "translation" else []


def side_args(a, case: Case, side: str, shape=None) -> list:
    """fairseq-train arguments of `side` (PACKED_SIDES) for `case` (shape: a pool's; the Trainer's by default:
    the pools hand it their batches)."""
    from .sides import optimizer_args, run_args, train_args
    from .families import FAMILIES

    base, packed = SIDE_OF[side]
    extra = width_args(a, case) + a.extra.split() + (["--ls-packed", packed] if packed else [])
    if case.family is None:
        ours = base == "ls"
        args = [case.data_bin, "--user-dir", os.path.join(a.repo, "fairseq_lightseq"), "--task", "sentence_prediction",
                "--arch", "ls_roberta_base" if ours else "roberta_base", "--criterion", "sentence_prediction",
                "--num-classes", "2", "--init-token", "0", "--separator-token", "2", "--max-positions", "512",
                "--batch-size", str(SENTENCE_BATCH), "--encoder-layers", str(case.layers),
                *optimizer_args(base), *run_args(a.device, "fp32")]
        return args + extra
    if case.family == "lm":
        extra = ["--sample-break-mode", "eos"] + extra
    shape = shape or (a.max_tokens[0], LM_BLOCK if case.family == "lm" else None)
    return train_args(FAMILIES[case.family], case.data_bin, a.repo, base, "base", a.device, "fp32", shape,
                      case.layers, extra)


def sweep_batch(dictionary, B: int, T: int, pad: float, seed: int) -> dict:
    """A translation batch of B sentence pairs, the longest T tokens (its </s> included) on both sides,
    as fairseq's LanguagePairDataset collates them (sources left-padded, targets right-padded): lengths
    T (1 - b / B)^k for b = 0 .. B-1, k = pad / (1 - pad), at least 2, so that about `pad` of the B x T
    positions of each side are padding. Word ids uniform over the dictionary's words."""
    import torch
    from fairseq.data.language_pair_dataset import collate

    g = torch.Generator().manual_seed(seed)
    k = pad / (1.0 - pad)
    lengths = [max(2, round(T * (1.0 - b / B) ** k)) for b in range(B)]
    items = []
    for i, n in enumerate(lengths):
        src, tgt = (torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g),
                               torch.tensor([dictionary.eos()])]) for _ in range(2))
        items.append({"id": i, "source": src, "target": tgt})
    return collate(items, dictionary.pad(), dictionary.eos())


def sweep_pool(data_bin: str, B: int, T: int, pad: float, n: int) -> list:
    from fairseq.data import Dictionary

    d = Dictionary.load(os.path.join(data_bin, "dict.en.txt"))
    return [sweep_batch(d, B, T, pad, seed) for seed in range(n)]


def padding(pool, pad: int = 1, target: bool = False) -> dict:
    """Padded positions over all positions of the [B, T] inputs the layers compute: src (the source, the
    LM's and RoBERTa's tokens), tgt (translation's decoder input, the shape of its target; None
    otherwise), all; and ideal = all positions / real positions, the speed-up a step whose every cost
    scales with the positions computed would get from packing."""
    src_slots = sum(s["net_input"]["src_tokens"].numel() for s in pool)
    src_real = sum(int(s["net_input"]["src_tokens"].ne(pad).sum()) for s in pool)
    slots, real = src_slots, src_real
    tgt = None
    if target:
        tgt_slots = sum(s["net_input"]["prev_output_tokens"].numel() for s in pool)
        tgt_real = sum(int(s["net_input"]["prev_output_tokens"].ne(pad).sum()) for s in pool)
        tgt = 1 - tgt_real / tgt_slots
        slots, real = slots + tgt_slots, real + tgt_real
    return {"src": 1 - src_real / src_slots, "tgt": tgt, "all": 1 - real / slots, "ideal": slots / real}


def break_even(points) -> dict:
    """points: [(pad fraction, packed speed-up over padded)] by pad fraction. The padding share at which
    packed starts to win: interpolated where the speed-up crosses 1 between two padded points (the 0
    point runs the padded path in both, see models.common.packings, and is left out)."""
    pts = [(p, r) for p, r in sorted(points) if p > 0]
    if not pts:
        return {"pad": None, "note": "no padded point"}
    if pts[0][1] >= 1:
        return {"pad": None, "note": f"packed is faster at every padded point (from {pts[0][0]:.1%})"}
    for (p0, r0), (p1, r1) in zip(pts, pts[1:]):
        if r0 < 1 <= r1:
            p = p0 + (1 - r0) * (p1 - p0) / (r1 - r0)
            return {"pad": p, "note": f"packed faster from about {p:.1%} padding"}
    return {"pad": None, "note": f"packed slower at every measured point (up to {pts[-1][0]:.1%})"}


def op_table(ops: dict, sides, top: int) -> list:
    """Rows (name, {side: self CPU ms per step or None}) for the union of each side's `top` ops by self
    CPU time, largest first by the first side's time; ops: {side: timing.op_breakdown dict}."""
    per = {s: {e["name"]: e["self_cpu_ms_per_step"] for e in (ops.get(s) or {}).get("top", [])} for s in sides}
    names = []
    for s in sides:
        for e in (ops.get(s) or {}).get("top", [])[:top]:
            if e["name"] not in names:
                names.append(e["name"])
    names.sort(key=lambda n: -max(per[s].get(n) or 0.0 for s in sides))
    return [(n, {s: per[s].get(n) for s in sides}) for n in names]
