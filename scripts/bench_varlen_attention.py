#!/usr/bin/env python
"""Times ops.varlen_attention (packed rows) forward+backward against the padded explicit attention the CPU
layers run (LSMultiheadAttention.attend: bmm(q, k^T), then ops.attention_softmax_dropout_bmm), on the CPU.

    python -m scripts.bench_varlen_attention [--threads 1] [--repeats 30] [--json out.json]

Per case: B sentences, H heads, head dim D; the padded side is [B, H, Tq, D] queries and [B, H, Tk, D] keys
and values (with a key padding mask when some sentence is shorter), the packed side holds only the real rows
[sum(Lq), H, D] and [sum(Lk), H, D]. Lengths: every sentence full ("0%"), or drawn uniformly from [T/2, T]
("pad", about a quarter padding; the same lengths on both sides). Each case with and without attention
dropout (p=0.1): encoder self-attention, causal decoder self-attention, cross-attention (Tq != Tk).
Neither side counts the head permutations around it (the padded side's split into and merge out of
[B, H, T, D]; the packed side's [N, H, D] is a view of a projection). Times: median and interquartile range
(and the minimum) of fwd+bwd in ms after a warm-up, the two sides interleaved (a b a b ...) so that drift hits both.
"""
import argparse
import json
import statistics
import time
from typing import Callable, List, NamedTuple, Tuple

import torch

from fairseq_lightseq import ops
from scripts.bench_support import check_args

# (name, B, Tq, Tk, H, D, causal)
CASES = [
    ("encoder T=48", 16, 48, 48, 4, 64, False),
    ("decoder T=48", 16, 48, 48, 4, 64, True),
    ("cross 30x32", 16, 30, 32, 4, 64, False),
    ("encoder T=128", 16, 128, 128, 4, 64, False),
    ("decoder T=128", 16, 128, 128, 4, 64, True),
]
TINY = [("tiny", 3, 5, 6, 2, 8, False)]  # a smoke run of the script itself


def _lengths(B, T, padded, g):
    if not padded:
        return [T] * B
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g).tolist()
    lengths[0] = T  # the padded problem is as long as its longest sentence
    return lengths


def _packed(x, lengths):
    """[B, H, T, D] -> [sum(lengths), H, D]: the real (leading) rows of every sentence."""
    return torch.cat([x[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)]).contiguous()


class Sides(NamedTuple):
    """The two sides of a case: closures running forward and backward once, their leaves (q, k, v: padded
    [B, H, T, D], packed [N, H, D]) and the sentence lengths."""
    padded: Callable[[], None]
    packed: Callable[[], None]
    padded_leaves: Tuple[torch.Tensor, ...]
    packed_leaves: Tuple[torch.Tensor, ...]
    lq: List[int]
    lk: List[int]


def sides(B, Tq, Tk, H, D, causal, padded, p, seed=0) -> Sides:
    g = torch.Generator().manual_seed(seed)
    lq = _lengths(B, Tq, padded, g)
    lk = lq if Tq == Tk else _lengths(B, Tk, padded, g)
    scale = D ** -0.5
    draw = ops.Dropout(p, 1234, 0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    q, k, v = leaf(B, H, Tq, D), leaf(B, H, Tk, D), leaf(B, H, Tk, D)
    gout = torch.randn(B, H, Tq, D, generator=g)
    for b, n in enumerate(lq):
        gout[b, :, n:] = 0  # the padded queries' outputs are not used: both sides get the same gradients
    kpm = None
    if any(n < Tk for n in lk):
        kpm = torch.arange(Tk).view(1, Tk) >= torch.tensor(lk).view(B, 1)
    pq, pk, pv = (_packed(t.detach(), n).requires_grad_() for t, n in ((q, lq), (k, lk), (v, lk)))
    pgout = _packed(gout, lq)
    cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32)

    def run_padded():
        q.grad = k.grad = v.grad = None
        scores = torch.bmm(q.view(B * H, Tq, D), k.view(B * H, Tk, D).transpose(1, 2)).view(B, H, Tq, Tk)
        ops.attention_softmax_dropout_bmm(scores, v, kpm, causal, scale, draw).backward(gout)

    def run_packed():
        pq.grad = pk.grad = pv.grad = None
        ops.varlen_attention(pq, pk, pv, cu_q, cu_k, Tq, Tk, causal, scale, draw).backward(pgout)

    return Sides(run_padded, run_packed, (q, k, v), (pq, pk, pv), lq, lk)


def time_pair(fns, warmup, repeats):
    """[(median ms, q1 ms, q3 ms, min ms)] per fn, timed in turns."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for t, fn in zip(times, fns):
            s = time.perf_counter()
            fn()
            t.append((time.perf_counter() - s) * 1e3)
    out = []
    for t in times:
        q1, med, q3 = statistics.quantiles(t, n=4)
        out.append((statistics.median(t), q1, q3, min(t)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cases", help="comma-separated substrings of the case names to run (default: all)")
    ap.add_argument("--tiny", action="store_true", help="one tiny case (a smoke run)")
    ap.add_argument("--json", help="also write the results here")
    check_args.add(ap)
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error("--repeats must be >= 2 (the quartiles need two times)")
    check_args.finish(args, "bench_varlen_attention.py")
    torch.set_num_threads(args.threads)
    cases = TINY if args.tiny else [c for c in CASES if not args.cases or any(s in c[0] for s in args.cases.split(","))]
    print(f"# varlen_attention vs padded explicit attention, CPU, {args.threads} thread(s), torch {torch.__version__},"
          f" fp32, median [q1, q3] ms of fwd+bwd over {args.repeats} runs")
    print(f"{'case':14s} {'lengths':7s} {'p':>4s} {'padded ms [q1, q3] min':>29s} {'varlen ms [q1, q3] min':>29s}"
          f" {'speedup':>8s}")
    rows = []
    for name, B, Tq, Tk, H, D, causal in cases:
        for padded in (False, True):
            for p in (0.0, 0.1):
                c = sides(B, Tq, Tk, H, D, causal, padded, p)
                a, b = time_pair((c.padded, c.packed), args.warmup, args.repeats)
                rows.append(dict(case=name, B=B, Tq=Tq, Tk=Tk, H=H, D=D, causal=causal, padded=padded, p=p,
                                 padded_ms=a, varlen_ms=b, speedup=a[0] / b[0]))
                print(f"{name:14s} {'pad' if padded else '0%':7s} {p:4.1f} "
                      f"{a[0]:8.2f} [{a[1]:5.2f}, {a[2]:5.2f}] {a[3]:5.2f} {b[0]:8.2f} [{b[1]:5.2f}, {b[2]:5.2f}] {b[3]:5.2f} "
                      f"{a[0] / b[0]:7.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(threads=args.threads, torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
