"""Time (forward + backward) and peak memory of the fused label-smoothed cross entropy against
fairseq's criterion math (log_softmax in fp32 + label_smoothed_nll_loss), and of the chunked
linear (projection + loss) path against projection-then-loss.

    python -m scripts.bench_criterion            # CPU here; CUDA when a GPU and the CUDA build exist
    python -m scripts.bench_criterion --device cpu --tokens 2048 --vocab 32768   # quicker

Peak memory: on CUDA, torch.cuda.max_memory_allocated() over the step minus the memory held before
it. On CPU, each case runs in a fresh subprocess and reports the growth of its peak resident set
size (getrusage ru_maxrss, which large tensors reach because glibc maps them with mmap) over the
RSS measured after the inputs were created: an upper bound that includes allocator slack.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from scripts.bench_support import check_args

PAD = 1
EPS = 0.1


def fairseq_math(logits, target):
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    lprobs = torch.log_softmax(logits.float(), dim=-1)
    loss, _ = label_smoothed_nll_loss(lprobs, target, EPS, ignore_index=PAD, reduce=True)
    return loss


def fused(logits, target):
    from fairseq_lightseq.ops import label_smoothed_cross_entropy

    return label_smoothed_cross_entropy(logits, target, EPS, PAD)[0].sum()


def linear_unfused(h, w, target):
    return fused(h @ w.t(), target)


def linear_fused(h, w, target, chunk):
    from fairseq_lightseq.ops import linear_label_smoothed_cross_entropy

    return linear_label_smoothed_cross_entropy(h, w, target, EPS, PAD, chunk_size=chunk, reduction="sum")[0]


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(case, device, dtype, n, V, d, chunk, iters):
    """Runs one case in this process; returns {"ms": per-step time, "peak_mb": peak growth}."""
    import fairseq.criterions.label_smoothed_cross_entropy  # noqa: F401  (imports outside the timing)
    import fairseq_lightseq.ops  # noqa: F401

    dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, V, (n,), generator=g)
    target[::10] = PAD
    target = target.to(device)
    if case.startswith("linear"):
        h = torch.randn(n, d, generator=g).to(device, dtype).requires_grad_()
        w = (torch.randn(V, d, generator=g) * d ** -0.5).to(device, dtype).requires_grad_()
        fn = (lambda: linear_fused(h, w, target, chunk)) if case == "linear_fused" else (
            lambda: linear_unfused(h, w, target))
        params = [h, w]
    else:
        z = (torch.randn(n, V, generator=g) * 2).to(device, dtype).requires_grad_()
        fn = (lambda: fused(z, target)) if case == "fused" else (lambda: fairseq_math(z, target))
        params = [z]

    def step():
        fn().backward()
        for p in params:
            p.grad = None

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":  # warm-up (allocator, kernels); skipped on CPU to keep the default run short
        step()
    sync()
    if device == "cuda":
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_bytes()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    ms = (time.perf_counter() - t0) / iters * 1e3
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"ms": ms, "peak_mb": peak / 2**20}


def measure(case, device, dtype, n, V, d, chunk, iters):
    if device == "cuda":
        return run_case(case, device, dtype, n, V, d, chunk, iters)
    # CPU: a fresh process per case, so that ru_maxrss is this case's peak.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where the scripts package lies
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    out = subprocess.run([sys.executable, "-m", "scripts.bench_criterion", "--child", json.dumps(
        [case, device, dtype, n, V, d, chunk, iters])], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="logits dtype (default fp16 on CUDA, fp32 on CPU)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32768, 40000])
    ap.add_argument("--linear-tokens", type=int, default=None, help="default: 8192 on CUDA, 1024 on CPU")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=None,
                    help="linear path rows per chunk (default: the op's, CHUNK_ELEMENTS // V, as the criterion)")
    ap.add_argument("--iters", type=int, default=None, help="timed steps (default 10 CUDA, 1 CPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    check_args.add(ap)
    a = ap.parse_args()
    check_args.finish(a, "bench_criterion.py")
    if a.child:
        print(json.dumps(run_case(*json.loads(a.child))))
        return
    cuda = a.device == "cuda"
    dtype = a.dtype or ("float16" if cuda else "float32")
    iters = a.iters or (10 if cuda else 1)
    lin_n = a.linear_tokens or (8192 if cuda else 1024)
    chunk = a.chunk
    print(f"device={a.device} dtype={dtype} iters={iters} threads={torch.get_num_threads()} "
          f"memory={'cuda max_memory_allocated' if cuda else 'subprocess peak RSS growth'}")
    for V in a.vocab:
        f = measure("fused", a.device, dtype, a.tokens, V, 0, 0, iters)
        r = measure("fairseq", a.device, dtype, a.tokens, V, 0, 0, iters)
        print(f"CE  N={a.tokens} V={V}: fused {f['ms']:.1f} ms {f['peak_mb']:.0f} MB | fairseq math "
              f"{r['ms']:.1f} ms {r['peak_mb']:.0f} MB | speedup {r['ms'] / f['ms']:.2f}x, "
              f"memory ratio {r['peak_mb'] / max(f['peak_mb'], 1e-9):.2f}x")
    V = a.vocab[0]
    if chunk is None:
        from fairseq_lightseq.ops.cross_entropy import _chunk_rows
        chunk = _chunk_rows(None, V)
    f = measure("linear_fused", a.device, dtype, lin_n, V, a.hidden, chunk, iters)
    u = measure("linear_unfused", a.device, dtype, lin_n, V, a.hidden, chunk, iters)
    print(f"LIN N={lin_n} V={V} d={a.hidden} chunk={chunk}: fused {f['ms']:.1f} ms {f['peak_mb']:.0f} MB | "
          f"unfused {u['ms']:.1f} ms {u['peak_mb']:.0f} MB | time ratio {u['ms'] / f['ms']:.2f}x, "
          f"memory ratio {u['peak_mb'] / max(f['peak_mb'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
