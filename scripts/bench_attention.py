#!/usr/bin/env python
"""Times the three attentions a training step can run on real length mixes, forward + backward: ours over
packed rows (ops.varlen_attention), torch's flash varlen kernel over the same packed rows (ops.flash_attention)
and torch's SDPA over the padded batch (the padded path's attention, with its masks: ops.blocks.attention's
sdpa_mask), fp16 and bf16, each with and without attention dropout. TFLOP/s count the useful work only (each
sentence's query-key pairs, half of them when causal; backward 2.5x the forward, FlashAttention's convention),
so the three rates compare directly on the same batch.

    python -m scripts.bench_attention --device cuda --multi30k DIR [--dtypes fp16,bf16] [--p 0,0.1] [--json out]

Length mixes (--mixes, default all), from Multi30k En-De's training text (--multi30k DIR: train.en.gz and
train.de.gz; default $FLS_MULTI30K, else shared/data/multi30k in the checkout; tokens: bench_support.multi30k's
split, plus EOS):
- mt: translation batches at --max-tokens (8192) as fairseq makes them: pairs ordered by source then target
  length, cut where the batch's padded tokens (its count x its longest side) would pass --max-tokens; --batches
  of them spread over the order. Encoder self-attention (source lengths), causal decoder self-attention
  (target lengths) and cross-attention (target over source), Transformer-big heads (16 x 64).
- roberta128, roberta512: masked-LM rows as fairseq's --sample-break-mode complete makes them from the English
  side: whole sentences up to T - 1 tokens a block, plus <s>; --max-tokens // T rows a batch, drawn from the
  blocks. Encoder self-attention, RoBERTa-base heads (12 x 64).
Without the corpus the script stops naming --multi30k. On a CPU (tests) torch's flash kernel is not there:
its cells say why (ops.flash_attention.flash_problem) and are not timed.
Times: median [q1, q3] and minimum ms over --repeats after --warmup, the three sides in turns (a b c a b c ...).
"""
import argparse
import gzip
import json
import os
import random
from typing import List, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F

from fairseq_lightseq import ops
from fairseq_lightseq.ops import flash_attention
from fairseq_lightseq.ops.blocks.attention import sdpa_key_padding_mask, sdpa_mask
from scripts.bench_support import check_args, provenance
from scripts.bench_support.multi30k import TOKEN, check_dir
from scripts.bench_varlen_attention import time_pair

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIXES = ("mt", "roberta128", "roberta512")
HEADS = {"mt": (16, 64), "roberta128": (12, 64), "roberta512": (12, 64)}
SIDES = ("ours", "flash", "sdpa_padded")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def token_counts(path: str) -> List[int]:
    """Tokens of each line of a gzipped text file (bench_support.multi30k's split), plus EOS."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [len(TOKEN.findall(line)) + 1 for line in f]


def mt_batches(src: Sequence[int], tgt: Sequence[int], max_tokens: int, n: int) -> List[tuple]:
    """n translation batches [(source lengths, target lengths)] as fairseq's batch_by_size cuts them from the
    pairs in LanguagePairDataset's order (by source length, then target length), the middles of n equal stretches
of that order."""
    order = sorted(range(len(src)), key=lambda i: (src[i], tgt[i]))
    batches, cur, longest = [], [], 0
    for i in order:
        size = max(src[i], tgt[i])
        if cur and (len(cur) + 1) * max(longest, size) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, size)
    if cur:
        batches.append(cur)
    picked = [batches[int((j + 0.5) * len(batches) / n)] for j in range(min(n, len(batches)))]
    return [([src[i] for i in b], [tgt[i] for i in b]) for b in picked]


def complete_blocks(lengths: Sequence[int], T: int) -> List[int]:
    """Token counts of fairseq's --sample-break-mode complete blocks for --tokens-per-sample T (masked_lm: whole
    sentences up to T - 1 tokens, one longer sentence alone and cut to T - 1; then <s> prepended)."""
    blocks, cur = [], 0
    for n in lengths:
        if cur and cur + n > T - 1:
            blocks.append(cur)
            cur = 0
        cur += n
        if cur >= T - 1:
            blocks.append(T - 1)
            cur = 0
    if cur:
        blocks.append(cur)
    return [b + 1 for b in blocks]


def roberta_batches(blocks: Sequence[int], T: int, max_tokens: int, n: int, seed: int = 0) -> List[tuple]:
    """n batches of max_tokens // T blocks each, drawn at random (an epoch's shuffle): [(lengths, lengths)]."""
    rng = random.Random(seed)
    rows = max(1, max_tokens // T)
    return [(lengths, lengths) for lengths in (rng.sample(list(blocks), rows) for _ in range(n))]


class Attention(NamedTuple):
    """One attention of one batch: sentence b has lq[b] queries and lk[b] keys."""
    mix: str
    batch: int
    kind: str  # encoder, decoder (causal) or cross
    lq: List[int]
    lk: List[int]
    causal: bool


def attentions(mix: str, batches: List[tuple]) -> List[Attention]:
    """The attentions a step runs on each batch: translation's three, RoBERTa's encoder self-attention."""
    out = []
    for i, (src, tgt) in enumerate(batches):
        if mix == "mt":
            out += [Attention(mix, i, "encoder", src, src, False), Attention(mix, i, "decoder", tgt, tgt, True),
                    Attention(mix, i, "cross", tgt, src, False)]
        else:
            out.append(Attention(mix, i, "encoder", src, src, False))
    return out


def useful_flops(lq: Sequence[int], lk: Sequence[int], H: int, D: int, causal: bool) -> float:
    """Forward + backward FLOPs over the real query-key pairs: 4 * D * H per pair forward (QK^T and PV), causal
    pairs j <= i only, backward 2.5x the forward."""
    pairs = sum(q * (q + 1) // 2 if causal else q * k for q, k in zip(lq, lk))
    return 3.5 * 4 * D * H * pairs


def _cu(lengths, device):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _padded(x: torch.Tensor, lengths: Sequence[int], T: int) -> torch.Tensor:
    """Packed [N, H, D] -> right-padded [B, H, T, D] (zeros after each sentence's rows)."""
    out = x.new_zeros(len(lengths), x.shape[1], T, x.shape[2])
    start = 0
    for b, n in enumerate(lengths):
        out[b, :, :n] = x[start:start + n].transpose(0, 1)
        start += n
    return out


class Sides(NamedTuple):
    """fns: {side: a closure running forward + backward once, or the reason it cannot run}; the leaves whose
    .grad the closures set: packed (q, k, v) [N, H, D] (ours, flash) and padded [B, H, T, D] (sdpa_padded)."""
    fns: dict
    packed: tuple
    padded: tuple


def sides(a: Attention, H: int, D: int, dtype, device: str, p: float, seed: int = 0) -> Sides:
    """The three sides of one attention: the same q, k, v and output gradient on each (packed rows, and the
    right-padded batch holding them)."""
    g = torch.Generator().manual_seed(seed)
    Nq, Nk, Tq, Tk = sum(a.lq), sum(a.lk), max(a.lq), max(a.lk)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q, k, v, gout = rand(Nq, H, D), rand(Nk, H, D), rand(Nk, H, D), rand(Nq, H, D)
    cu_q, cu_k = _cu(a.lq, device), _cu(a.lk, device)
    scale = D ** -0.5
    leaves = [t.requires_grad_() for t in (q, k, v)]
    pq, pk, pv = (_padded(t.detach(), n, T).requires_grad_() for t, n, T in ((q, a.lq, Tq), (k, a.lk, Tk), (v, a.lk, Tk)))
    pgout = _padded(gout, a.lq, Tq)
    kpm = torch.arange(Tk, device=device).view(1, Tk) >= torch.tensor(a.lk, device=device).view(-1, 1)
    # the padded path's masks: rows are right-padded, so causal self-attention needs none
    mask, is_causal = sdpa_mask(sdpa_key_padding_mask(kpm, a.causal, right_padded=True), a.causal, Tq, Tk, device)

    def clear(ts):
        for t in ts:
            t.grad = None

    def ours():
        clear(leaves)
        ops.varlen_attention(q, k, v, cu_q, cu_k, Tq, Tk, a.causal, scale, p).backward(gout)

    def flash():
        clear(leaves)
        flash_attention.flash_varlen_attention(q, k, v, cu_q, cu_k, Tq, Tk, a.causal, scale, p).backward(gout)

    def sdpa_padded():
        clear((pq, pk, pv))
        F.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask, dropout_p=p, is_causal=is_causal,
                                       scale=scale).backward(pgout)

    problem = flash_attention.flash_problem(torch.device(device), dtype, D)
    return Sides({"ours": ours, "flash": flash if problem is None else problem, "sdpa_padded": sdpa_padded},
                 tuple(leaves), (pq, pk, pv))


def _synced(fn, device):
    if device != "cuda":
        return fn

    def run():
        fn()
        torch.cuda.synchronize()
    return run


def measure(a: Attention, H: int, D: int, dtype_name: str, device: str, p: float, warmup: int, repeats: int) -> dict:
    """One row: the attention's shape, padding, and per side {ms: [median, q1, q3, min], tflops} or {skipped}."""
    fns = sides(a, H, D, DTYPES[dtype_name], device, p).fns
    timed = [s for s in SIDES if callable(fns[s])]
    if device == "cuda":
        torch.cuda.synchronize()
    times = dict(zip(timed, time_pair([_synced(fns[s], device) for s in timed], warmup, repeats)))
    flops = useful_flops(a.lq, a.lk, H, D, a.causal)
    row = {"mix": a.mix, "batch": a.batch, "attention": a.kind, "dtype": dtype_name, "p": p, "B": len(a.lq),
           "tokens_q": sum(a.lq), "tokens_k": sum(a.lk), "max_q": max(a.lq), "max_k": max(a.lk), "heads": H,
           "head_dim": D, "padding": 1 - sum(a.lq) / (len(a.lq) * max(a.lq)), "useful_gflop": flops / 1e9,
           "sides": {}}
    for s in SIDES:
        if s in times:
            row["sides"][s] = {"ms": list(times[s]), "tflops": flops / (times[s][0] * 1e-3) / 1e12}
        else:
            row["sides"][s] = {"skipped": fns[s]}
    return row


def default_corpus() -> Optional[str]:
    return os.environ.get("FLS_MULTI30K") or os.path.join(REPO, "shared", "data", "multi30k")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--multi30k", default=default_corpus(), help="Multi30k En-De folder (train.en.gz, train.de.gz)")
    ap.add_argument("--mixes", default=",".join(MIXES), help=f"comma-separated, of {', '.join(MIXES)}")
    ap.add_argument("--dtypes", default="fp16,bf16", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--p", default="0,0.1", help="attention-dropout probabilities, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=8192, help="padded tokens a batch (default 8192)")
    ap.add_argument("--batches", type=int, default=2, help="batches per mix (default 2)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", help="also write the results here")
    check_args.add(ap)
    a = ap.parse_args(argv)
    mixes, dtypes = a.mixes.split(","), a.dtypes.split(",")
    bad = [m for m in mixes if m not in MIXES] + [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"unknown --mixes/--dtypes value(s): {', '.join(bad)}")
    if a.repeats < 2:
        ap.error("--repeats must be >= 2 (the quartiles need two times)")
    ps = [float(x) for x in a.p.split(",")]
    if not all(0 <= x < 1 for x in ps):
        ap.error(f"--p values must be in [0, 1), got {a.p}")
    check_args.finish(a, "bench_attention.py")
    try:
        corpus = check_dir(a.multi30k)
    except ValueError as e:
        ap.error(str(e))
    src, tgt = token_counts(os.path.join(corpus, "train.en.gz")), token_counts(os.path.join(corpus, "train.de.gz"))
    work = []
    for mix in mixes:
        if mix == "mt":
            batches = mt_batches(src, tgt, a.max_tokens, a.batches)
        else:
            T = int(mix[len("roberta"):])
            batches = roberta_batches(complete_blocks(src, T), T, a.max_tokens, a.batches)
        work += attentions(mix, batches)
    print(f"# attention fwd+bwd, {a.device}, torch {torch.__version__}: ours (packed) | flash varlen (packed) | "
          f"SDPA (padded); median ms [q1, q3], TFLOP/s of the real pairs", flush=True)
    rows = []
    for att in work:
        H, D = HEADS[att.mix]
        for dt in dtypes:
            for p in ps:
                r = measure(att, H, D, dt, a.device, p, a.warmup, a.repeats)
                rows.append(r)
                cells = " | ".join(f"{s} {c['ms'][0]:7.2f} [{c['ms'][1]:.2f}, {c['ms'][2]:.2f}] {c['tflops']:6.1f}"
                                   if "ms" in c else f"{s} n/a" for s, c in r["sides"].items())
                print(f"{att.mix:10s} b{att.batch} {att.kind:7s} {dt} p={p:.1f} B={r['B']:4d} N={r['tokens_q']:5d} "
                      f"pad {r['padding']:.0%}: {cells}", flush=True)
    skipped = {c["skipped"] for r in rows for c in r["sides"].values() if "skipped" in c}
    for reason in sorted(skipped):
        print(f"not timed: {reason}")
    if a.json:
        res = {"device": a.device, "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
               "torch": torch.__version__, "argv": list(argv) if argv is not None else None, "rows": rows}
        with open(a.json, "w") as f:
            json.dump(provenance.record(res, REPO, ((corpus, "<multi30k>"),)), f, indent=1)


if __name__ == "__main__":
    main()
