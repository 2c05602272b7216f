#!/usr/bin/env python
"""Times each fused op forward+backward against the pure-PyTorch reference and against the plain
PyTorch composition a fairseq layer uses, at Transformer-base and -big shapes (4096 tokens).

CPU:  python -m scripts.bench_ops                      (fp32)
CUDA: python -m scripts.bench_ops --device cuda --dtype fp16 --json out.json
      also reports each op's achieved bandwidth (forward and backward separately) as a fraction
      of a measured device-to-device copy, from the device time of the kernels it launches
      (torch.profiler): at 4096 tokens one op's wall time is mostly host time (Python, launches),
      which training hides by queueing ahead, so wall time cannot show what a kernel achieves.
      Wall-time ratios are printed too; the JSON also lists each op's longest kernels.

Ratios > 1 mean ours is faster. Inputs are random (never zeros); the same inputs feed all three.
"""
import argparse
import json
import math
import statistics
import time
import os

import torch
import torch.nn.functional as F

from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference
from scripts.bench_support import check_args

SHAPES = {
    "base": dict(tokens=4096, hidden=512, ffn=2048, heads=8, seq=128, vocab=32000),
    "big": dict(tokens=4096, hidden=1024, ffn=4096, heads=16, seq=128, vocab=32000),
    # GPU bandwidth: the base/big tensors (4-32 MB) fit in an H200's 60 MB L2, so --shapes large gives
    # Transformer-big layers over 64k tokens (128 MB and more per tensor).
    "large": dict(tokens=65536, hidden=1024, ffn=4096, heads=16, seq=128, vocab=32000),
    # long sequences: 2048 keys take the attention kernels' general (not register-row) path
    "long": dict(tokens=16384, hidden=1024, ffn=4096, heads=16, seq=2048, vocab=32000),
    # a smoke run of the script itself (tests)
    "tiny": dict(tokens=64, hidden=24, ffn=40, heads=3, seq=16, vocab=50),
}
P = 0.1  # dropout probability used everywhere (fairseq's usual 0.1 attention/activation/residual)

# The public ops of fairseq_lightseq.ops that cases() does not time, and the script that does (None: not
# a training op). Every other public op needs an entry in cases(): tests/ops/test_bench_ops.py fails
# for an op group added without one. cases(elsewhere=True) adds the loss and the Adam step for the kernel
# profile (scripts/kernel_profile/), whose table covers every kernel of csrc/cuda; the linear loss launches the
# same two loss kernels on each chunk of its logits (its GEMMs are cuBLAS's), so it has no case of its own.
TIMED_ELSEWHERE = {
    "adam_step": "scripts/bench_optimizer.py",
    "label_smoothed_cross_entropy": "scripts/bench_criterion.py",
    "linear_label_smoothed_cross_entropy": "scripts/bench_criterion.py",
    "dropout_mask": None,  # the raw keep mask, exposed for the tests; no layer calls it
    "attention_dropout": None,  # timed inside attention_softmax_dropout_bmm's backward, its one caller here
}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _time_once(fn, device, inner):
    """Seconds of one fn() call: perf_counter on CPU; on CUDA, events around `inner` back-to-back
    calls (so host launch gaps between repeats do not count), divided by `inner`."""
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / inner
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def timeit(fn, device, warmup=3, repeats=10, inner=10):
    """Median seconds of fn() after warm-up."""
    return timeit_interleaved([fn], device, warmup, repeats, inner)[0]


def timeit_interleaved(fns, device, warmup=3, repeats=10, inner=10):
    """Median seconds of each fn, timed in turns (a b a b ...) so that drift in the machine's state
    (other load, the allocator's page faults, clocks) hits all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    _sync(device)
    times = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            times[k].append(_time_once(fn, device, inner))
    return [statistics.median(t) for t in times]


def fwd_bwd(f, inputs, grad_out):
    """A closure running f(*inputs) forward and backward with grad_out (a tuple of gradients for an op
    with several outputs)."""
    def run():
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None
        torch.autograd.backward(f(*inputs), grad_out)
    return run


class BiasInLinear(torch.autograd.Function):
    """How fairseq's layers pay for a linear's bias, for the compositions below: the GEMM adds it
    (cuBLAS's epilogue, no memory pass), so the forward here is free, `x` standing for the biased
    GEMM output; the backward still owes the bias gradient, a column sum of dy, as the linear's
    backward computes it. Our ops get x without the bias and add it themselves."""

    @staticmethod
    def forward(ctx, x, bias):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, dy.sum(dim=tuple(range(dy.dim() - 1)))


def ideal_bytes(s, e):
    """{op name: (forward bytes, backward bytes)} at shape `s` with `e` bytes an element, (step bytes,) for the
    Adam step: what each op must move, every input read once and every output written once (the yardstick of the
    bandwidth columns here and of scripts/kernel_profile's traffic ratio and prediction)."""
    N, C, Fd, H, T, V = s["tokens"], s["hidden"], s["ffn"], s["heads"], s["seq"], s["vocab"]
    B = N // T
    L = T - T // 8  # the packed rows' sentence length (varlen_attention)
    scores = B * H * T * T
    return {
        "layer_norm": (2 * N * C * e, 3 * N * C * e),
        "bias_dropout_residual": (3 * N * C * e, 2 * N * C * e),
        "dropout": (2 * N * C * e, 2 * N * C * e),
        "bias_act_dropout[relu]": (2 * N * Fd * e, 3 * N * Fd * e),
        "bias_act_dropout[gelu]": (2 * N * Fd * e, 3 * N * Fd * e),
        "attention_softmax_dropout": (3 * scores * e, 3 * scores * e),
        "attention_softmax_dropout_bmm": (3 * scores * e, 5 * scores * e),
        "qkv_bias_split": (2 * 3 * N * C * e, 2 * 3 * N * C * e),
        "merge_heads": (2 * N * C * e, 2 * N * C * e),
        "varlen_attention": (4 * B * L * C * e, 8 * B * L * C * e),
        # backward: read the gradient, write every row of the dense table gradient once
        "embedding": (2 * N * C * e, (N + V) * C * e),
        # forward: the logits read once, the targets (int64), the loss, nll and logsumexp written (fp32 a row);
        # backward: the logits read once and their gradient written once, the targets, dloss, dnll and lse
        "label_smoothed_cross_entropy": (N * V * e + 20 * N, 2 * N * V * e + 20 * N),
        # one pass, the step: params, exp_avg and exp_avg_sq (fp32) read and written, the gradient (e bytes) read
        "adam_step": ((24 + e) * adam_params(s),),
    }


def adam_shapes(s):
    """The parameter shapes the Adam step updates at shape `s`: scripts/bench_optimizer.py's Transformer at the
    shape's widths, a shared [vocab, hidden] embedding and 6 encoder and 6 decoder layers (Transformer-big's 210M
    parameters in 257 tensors at big and large, Transformer-base's 61M at base). With s["adam_sample"] (the
    emulated device's, scripts/kernel_profile/launches.py): one encoder layer's, every kind of tensor the model
    has (the embedding table is one more matrix, and the kernel's chunks of any tensor are alike)."""
    from scripts.bench_optimizer import layer_shapes, transformer_big_shapes

    if s.get("adam_sample"):
        return layer_shapes(s["hidden"], s["ffn"])[0]
    return transformer_big_shapes(6, s["vocab"], s["hidden"], s["ffn"])


def adam_params(s) -> int:
    """The parameter count of adam_shapes(s)."""
    return sum(math.prod(x) for x in adam_shapes(s))


def cases(s, device, dtype, elsewhere=False):
    """(name, inputs, grad_out, ours, reference, composition, bytes_fwd, bytes_bwd) per op; elsewhere: also the
    loss and the Adam step of TIMED_ELSEWHERE (the kernel profile's). An op without a backward (the Adam step,
    which updates its tensors in place) has grad_out None: its one pass is ours(*inputs), bytes_fwd its bytes and
    bytes_bwd None."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, grad=True):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)

    N, C, Fd, H, T, V = s["tokens"], s["hidden"], s["ffn"], s["heads"], s["seq"], s["vocab"]
    B = N // T
    nbytes = ideal_bytes(s, torch.finfo(dtype).bits // 8)
    seed = 1234
    out = []

    x, w, b = rnd(N, C), rnd(C), rnd(C)
    out.append(("layer_norm", (x, w, b), rnd(N, C, grad=False),
                lambda x, w, b: ops.layer_norm(x, w, b),
                lambda x, w, b: reference.layer_norm(x, w, b),
                lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5), *nbytes["layer_norm"]))

    r = rnd(N, C)
    out.append(("bias_dropout_residual", (x, b, r), rnd(N, C, grad=False),
                lambda x, b, r: ops.bias_dropout_residual(x, b, r, P),
                lambda x, b, r: reference.bias_dropout_residual(x, b, r, P, seed),
                lambda x, b, r: r + F.dropout(BiasInLinear.apply(x, b), P), *nbytes["bias_dropout_residual"]))

    # plain dropout (--layernorm-embedding's): the keep mask drawn by the dropout_mask kernel, then one
    # multiply; backward draws the mask again
    out.append(("dropout", (x,), rnd(N, C, grad=False),
                lambda x: ops.dropout(x, P),
                lambda x: reference.dropout(x, P, seed),
                lambda x: F.dropout(x, P), *nbytes["dropout"]))

    h, hb = rnd(N, Fd), rnd(Fd)
    for act, fn in (("relu", F.relu), ("gelu", F.gelu)):
        out.append((f"bias_act_dropout[{act}]", (h, hb), rnd(N, Fd, grad=False),
                    lambda x, b, act=act: ops.bias_act_dropout(x, b, P, act),
                    lambda x, b, act=act: reference.bias_act_dropout(x, b, P, act, seed),
                    lambda x, b, fn=fn: F.dropout(fn(BiasInLinear.apply(x, b)), P), *nbytes[f"bias_act_dropout[{act}]"]))

    sc = rnd(B, H, T, T)
    kpm = torch.zeros(B, T, dtype=torch.bool, device=device)
    kpm[:, T - T // 8:] = True  # the last eighth of every row is padding
    scale = (C // H) ** -0.5

    def softmax_comp(s_):
        z = (s_ * scale).masked_fill(kpm.view(B, 1, 1, T), float("-inf"))
        return F.dropout(F.softmax(z, dim=-1, dtype=torch.float32).type_as(s_), P)

    out.append(("attention_softmax_dropout", (sc,), rnd(B, H, T, T, grad=False),
                lambda s_: ops.attention_softmax_dropout(s_, kpm, False, scale, P),
                lambda s_: reference.attention_softmax_dropout(s_, kpm, False, scale, P, seed),
                softmax_comp, *nbytes["attention_softmax_dropout"]))

    # probabilities times v in one node: backward draws the dropped probabilities again (one more pass
    # over [B, H, T, T]) instead of keeping them; the composition keeps them, as autograd does
    v = rnd(B, H, T, C // H)
    out.append(("attention_softmax_dropout_bmm", (sc, v), rnd(B, H, T, C // H, grad=False),
                lambda s_, v_: ops.attention_softmax_dropout_bmm(s_, v_, kpm, False, scale, P),
                lambda s_, v_: torch.matmul(reference.attention_softmax_dropout(s_, kpm, False, scale, P, seed), v_),
                lambda s_, v_: torch.matmul(softmax_comp(s_), v_), *nbytes["attention_softmax_dropout_bmm"]))

    qkv, qb = rnd(T, B, 3 * C), rnd(3 * C)

    # The same outputs (contiguous [B*H, T, hd] heads) in plain PyTorch: one copy per head tensor.
    # fairseq's own layer has no such step: it hands bmm strided views of its separate q/k/v
    # projections, so against fairseq this op is one extra pass, paid for by one fused QKV GEMM and
    # the q scaling it folds into the softmax; benchmark.py's training step is the measure that counts.
    def split_comp(t, bias):
        y = BiasInLinear.apply(t, bias).view(T, B, 3, H, C // H)
        # one copy each; unbind's backward writes the [T, B, 3E] gradient once (indexing would sum 3)
        return tuple(part.permute(1, 2, 0, 3).reshape(B * H, T, C // H) for part in y.unbind(2))

    # three outputs, three gradients (no concatenation: its copy would be timed and counted as ours)
    out.append(("qkv_bias_split", (qkv, qb), tuple(rnd(B * H, T, C // H, grad=False) for _ in range(3)),
                lambda t, bias: ops.qkv_bias_split(t, bias, H),
                lambda t, bias: reference.qkv_bias_split(t, bias, H),
                split_comp, *nbytes["qkv_bias_split"]))

    o = rnd(B * H, T, C // H)
    out.append(("merge_heads", (o,), rnd(T, B, C, grad=False),
                lambda t: ops.merge_heads(t, H),
                lambda t: reference.merge_heads(t, H),
                lambda t: t.transpose(0, 1).contiguous().view(T, B, C), *nbytes["merge_heads"]))

    # attention over packed rows: the same batch without its padding (every sentence T - T/8 tokens), against
    # fairseq's padded composition (pad, q k^T, masked softmax, dropout, @ v, unpad)
    L = T - T // 8
    pq, pk, pv = (rnd(B * L, H, C // H) for _ in range(3))
    cu = torch.arange(0, B * L + 1, L, dtype=torch.int32, device=device)
    real = ~kpm

    def varlen_comp(q_, k_, v_):
        padded = [q_.new_zeros(B, T, H, C // H).index_put((real.nonzero(as_tuple=True)), t_).transpose(1, 2)
                  for t_ in (q_, k_, v_)]
        ctx = torch.matmul(softmax_comp(torch.matmul(padded[0], padded[1].transpose(-1, -2))), padded[2])
        return ctx.transpose(1, 2)[real]

    out.append(("varlen_attention", (pq, pk, pv), rnd(B * L, H, C // H, grad=False),
                lambda q_, k_, v_: ops.varlen_attention(q_, k_, v_, cu, cu, L, L, False, scale, P),
                lambda q_, k_, v_: reference.varlen_attention(q_, k_, v_, cu, cu, L, L, False, scale, P, seed),
                varlen_comp, *nbytes["varlen_attention"]))

    tok = torch.randint(2, V, (B, T), generator=g).to(device)
    tok[:, : T // 8] = 1  # left padding, pad index 1 (fairseq's)
    W = rnd(V, C)
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
    pos_table = SinusoidalPositionalEmbedding.get_embedding(T + 2, C, 1).to(device=device, dtype=dtype)
    positions = reference.make_positions(tok, 1)
    emb_scale = math.sqrt(C)

    def emb_comp(w_):
        return F.dropout(emb_scale * F.embedding(tok, w_, 1) + F.embedding(positions, pos_table), P)

    out.append(("embedding", (W,), rnd(B, T, C, grad=False),
                lambda w_: ops.embedding(tok, w_, pos_table, 1, emb_scale, P),
                lambda w_: reference.embedding(tok, w_, pos_table, 1, emb_scale, P, seed),
                emb_comp, *nbytes["embedding"]))
    if elsewhere:
        out += _elsewhere_cases(s, device, dtype, nbytes)
    return out


def _elsewhere_cases(s, device, dtype, nbytes):
    """cases()' entries for the loss and the Adam step. Their tensors are made on the device without a generator:
    at large the logits are [65536, 32000] and the Adam step's tensors 4 x 210M elements, which the CPU generator
    and the copy would spend much of the GPU check's kernel_times step on (gpu_times.py, 45 s); the kernels'
    traffic does not depend on the values."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    N, V = s["tokens"], s["vocab"]
    eps, pad = 0.1, 1  # fairseq's usual label smoothing and padding index
    logits = torch.randn(N, V, device=device, dtype=dtype).requires_grad_()
    tgt = torch.randint(pad + 1, V, (N,), device=device)  # no padding: every row is read and written

    def loss_comp(z):  # fairseq's criterion: log_softmax in fp32, then its label-smoothed loss per token
        return label_smoothed_nll_loss(torch.log_softmax(z.float(), -1), tgt, eps, ignore_index=pad,
                                       reduce=False)[0].view(-1)

    out = [("label_smoothed_cross_entropy", (logits,), torch.rand(N, device=device),
            lambda z: ops.label_smoothed_cross_entropy(z, tgt, eps, pad)[0],
            lambda z: reference.label_smoothed_cross_entropy(z, tgt, eps, pad)[0],
            loss_comp, *nbytes["label_smoothed_cross_entropy"])]

    # fp32 params and Adam state, grads in `dtype` (fp32 under fairseq's --fp16/--bf16, whose fp32 master params
    # get fp32 grads; the run's dtype under --memory-efficient-fp16/bf16)
    shapes = adam_shapes(s)
    p, g = ([torch.randn(x, device=device, dtype=t) for x in shapes] for t in (torch.float32, dtype))
    m, v = ([torch.zeros(x, device=device) for x in shapes] for _ in range(2))
    args = (10, 1e-4, 0.9, 0.98, 1e-8, 0.01)  # step (past the first), lr, betas, eps, weight decay: bench_optimizer's
    out.append(("adam_step", (p, g, m, v), None,
                lambda *t: ops.adam_step(*t, *args),
                lambda *t: reference.adam_step(*t, *args),
                None,  # fairseq's adam keeps its own state per parameter: scripts/bench_optimizer.py times it
                *nbytes["adam_step"], None))
    return out


def kernel_launches(fn, repeats=10):
    """CUDA only: {kernel name: (device seconds, launches) per fn() call} for the kernels, memsets and copies
    fn launches (CUPTI records, via torch.profiler), averaged over `repeats` calls after one warm-up call.
    Host time (Python, launch gaps) is not in it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            t, n = out.get(e.name, (0.0, 0.0))
            out[e.name] = (t + e.time_range.elapsed_us() / 1e6 / repeats, n + 1 / repeats)
    return out


def kernel_times(fn, repeats=10):
    """CUDA only: {kernel name: device seconds per fn() call} (see kernel_launches)."""
    return {name: t for name, (t, _) in kernel_launches(fn, repeats).items()}


def kernel_seconds(fn, repeats=10):
    """CUDA only: device seconds of one fn() call, all its kernels together (see kernel_times)."""
    return sum(kernel_times(fn, repeats).values())


def top_kernels(times, k=4):
    """The k longest kernels of a kernel_times result as [(short name, microseconds)]."""
    def short(name):  # "void ns::(anonymous namespace)::kern<half, 16>(args)" -> "ns::kern<half, 16>"
        name = name.replace("(anonymous namespace)::", "")
        return name.removeprefix("void ").split("(")[0].strip()[:100]

    top = sorted(times.items(), key=lambda kv: -kv[1])[:k]
    return [(short(name), round(t * 1e6, 1)) for name, t in top]


_copy_seconds = {}


def copy_kernel_seconds(nbytes):
    """Device seconds of one device-to-device copy moving `nbytes` in all (nbytes / 2 read, nbytes / 2
    written): the yardstick for an op moving the same bytes."""
    if nbytes not in _copy_seconds:
        src = torch.empty(max(1, nbytes // 8), dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        _copy_seconds[nbytes] = kernel_seconds(lambda: dst.copy_(src))
    return _copy_seconds[nbytes]


def bandwidth(f, inputs, grad_out, nbytes_fwd, nbytes_bwd, copy_bw):
    """Forward alone and backward alone, from kernel device time: the fraction of the 1 GB copy's
    bandwidth achieved, and a same-size copy's time over ours (1.0 = as fast as a copy moving the
    same bytes). None where no kernel runs (a backward that is a view). Then the longest kernels of each."""
    out = f(*inputs)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    k_f = kernel_times(lambda: f(*inputs))
    k_b = kernel_times(lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True))
    t_f, t_b = sum(k_f.values()), sum(k_b.values())

    def frac(nbytes, t):
        return (None, None) if t <= 0 else (nbytes / t / copy_bw, copy_kernel_seconds(nbytes) / t)

    return frac(nbytes_fwd, t_f) + frac(nbytes_bwd, t_b) + (top_kernels(k_f), top_kernels(k_b))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--shapes", default="base,big", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--ops", help="comma-separated op names to run (default: all)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--skip-ref", action="store_true",
                    help="do not time the reference (the slow spec; the composition is the baseline that matters)")
    check_args.add(ap)
    args = ap.parse_args(argv)
    unknown = [x for x in args.shapes.split(",") if x not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    names = [c[0] for c in cases(SHAPES["tiny"], "cpu", torch.float32)]
    unknown = [x for x in (args.ops or "").split(",") if x and x not in names]
    if unknown:
        ap.error(f"--ops: unknown {', '.join(unknown)}; choose from {', '.join(names)}")
    if args.device == "cuda" and not torch.cuda.is_available() and not args.check_args:
        ap.error("--device cuda: torch sees no CUDA device")
    check_args.finish(args, "bench_ops.py")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    device = args.device
    copy_bw = (2 << 30) / copy_kernel_seconds(2 << 30) if device == "cuda" else None  # a 1 GB copy
    host = (torch.cuda.get_device_name() if device == "cuda"
            else f"CPU, {torch.get_num_threads()} threads")
    print(f"# bench_ops on {host}, torch {torch.__version__}, {args.dtype}, dropout p={P}")
    if copy_bw:
        print(f"# device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    header = f"{'shape':5s} {'op':28s} {'ours ms':>9s} {'ref ms':>9s} {'comp ms':>9s} {'vs ref':>7s} {'vs comp':>8s}"
    if copy_bw:
        # From kernel device time: "vs comp kern", the composition's fwd+bwd kernel time over ours;
        # BW, the fraction of the 1 GB copy's bandwidth; "vs copy", a copy moving the same bytes, its
        # kernel time over ours.
        header += (f" {'vs comp kern':>12s} {'fwd BW':>7s} {'bwd BW':>7s} {'fwd vs copy':>12s}"
                   f" {'bwd vs copy':>12s}")
    print(header)
    rows = []
    for shape in args.shapes.split(","):
        for name, inputs, gout, ours, ref, comp, bf, bb in cases(SHAPES[shape], device, dtype):
            if args.ops and name not in args.ops.split(","):
                continue
            t_o, t_c = timeit_interleaved([fwd_bwd(ours, inputs, gout), fwd_bwd(comp, inputs, gout)], device,
                                          repeats=args.repeats)
            # The reference draws its dropout masks with Philox in int64 torch ops: seconds per call
            # on CPU, so it gets fewer runs.
            t_r = (float("nan") if args.skip_ref else
                   timeit(fwd_bwd(ref, inputs, gout), device, warmup=1, repeats=max(3, args.repeats // 3)))
            row = dict(shape=shape, op=name, ours_ms=t_o * 1e3, ref_ms=t_r * 1e3, comp_ms=t_c * 1e3,
                       speedup_vs_ref=t_r / t_o, speedup_vs_comp=t_c / t_o)
            line = (f"{shape:5s} {name:28s} {t_o * 1e3:9.2f} {t_r * 1e3:9.2f} {t_c * 1e3:9.2f} "
                    f"{t_r / t_o:6.2f}x {t_c / t_o:7.2f}x")
            if copy_bw:
                k_o, k_c = (kernel_seconds(fwd_bwd(f, inputs, gout)) for f in (ours, comp))
                fb, fc, bbw, bc, kf, kb = bandwidth(ours, inputs, gout, bf, bb, copy_bw)
                row.update(ours_kernel_ms=k_o * 1e3, comp_kernel_ms=k_c * 1e3, speedup_vs_comp_kernels=k_c / k_o,
                           fwd_bw_frac=fb, bwd_bw_frac=bbw, fwd_vs_same_size_copy=fc, bwd_vs_same_size_copy=bc,
                           fwd_top_kernels_us=kf, bwd_top_kernels_us=kb)
                line += f" {k_c / k_o:11.2f}x" + "".join(
                    f" {v:{w}.0%}" if v is not None else f" {'view':>{w}s}" for v, w in
                    ((fb, 7), (bbw, 7), (fc, 12), (bc, 12)))
            print(line, flush=True)
            rows.append(row)
    if args.json:
        from scripts.bench_support.provenance import record

        with open(args.json, "w") as f:
            json.dump(record(dict(host=host, torch=torch.__version__, dtype=args.dtype, copy_bw=copy_bw, rows=rows),
                             os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), f, indent=1)


if __name__ == "__main__":
    main()
