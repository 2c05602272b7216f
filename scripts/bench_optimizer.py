"""Times one ls_adam step (the fused multi-tensor kernel) against fairseq's `adam` step.

The parameter list is shaped like Transformer-big (en-de, shared embeddings, 6+6 layers of
d=1024/ffn=4096: ~210M fp32 params in 257 tensors). On CPU the default is a smaller model
(--layers 1 --vocab 8192) so that the run takes well under a minute; the size used is printed.

    python -m scripts.bench_optimizer [--device cpu|cuda] [--layers N] [--vocab V] [--repeat R]
"""
import argparse
import time

import torch

from fairseq.optim.adam import Adam as FairseqAdamImpl

from scripts.bench_support import check_args

from fairseq_lightseq import ops
from fairseq_lightseq.optim import FusedAdam


def layer_shapes(d=1024, ffn=4096):
    """The parameter shapes of one encoder layer and of one decoder layer: the attention projections' and the FFN's
    weights [out, in] and biases [out], the layer norms' weights and biases [d]."""
    linear = lambda o, i: [(o, i), (o,)]  # noqa: E731
    attn = sum((linear(d, d) for _ in range(4)), [])
    ln = [(d,), (d,)]
    enc = attn + ln + linear(ffn, d) + linear(d, ffn) + ln
    dec = attn + ln + attn + ln + linear(ffn, d) + linear(d, ffn) + ln
    return enc, dec


def transformer_big_shapes(layers, vocab, d=1024, ffn=4096):
    enc, dec = layer_shapes(d, ffn)
    ln = [(d,), (d,)]
    return [(vocab, d)] + enc * layers + ln + dec * layers + ln


def make_params(shapes, device):
    g = torch.Generator(device=device).manual_seed(0)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(*s, device=device, generator=g) * 0.02)
        p.grad = torch.randn(*s, device=device, generator=g) * 1e-3
        params.append(p)
    return params


def time_steps(opt, device, repeat):
    opt.step()  # creates the state
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeat):
        opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeat


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=None, help="encoder = decoder layers (default 6; 1 on CPU)")
    ap.add_argument("--vocab", type=int, default=None, help="shared embedding rows (default 32768; 8192 on CPU)")
    ap.add_argument("--repeat", type=int, default=None, help="timed steps (default 20 CUDA, 3 CPU)")
    check_args.add(ap)
    args = ap.parse_args()
    check_args.finish(args, "bench_optimizer.py")
    cpu = args.device == "cpu"
    layers = args.layers if args.layers is not None else (1 if cpu else 6)
    vocab = args.vocab if args.vocab is not None else (8192 if cpu else 32768)
    repeat = args.repeat if args.repeat is not None else (3 if cpu else 20)
    shapes = transformer_big_shapes(layers, vocab)
    params = make_params(shapes, args.device)
    n = sum(p.numel() for p in params)
    print(f"device={args.device} threads={torch.get_num_threads()} layers={layers} vocab={vocab} "
          f"tensors={len(params)} params={n / 1e6:.1f}M (fp32 params/grads/state) kernel="
          f"{ops.has_kernel('adam_step_', args.device)}")
    kw = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
    results = {}
    for name, cls in [("ls_adam (fused)", FusedAdam), ("fairseq adam", FairseqAdamImpl)]:
        opt = cls(params, **kw)
        results[name] = time_steps(opt, args.device, repeat)
        del opt
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.device == "cuda":
        opt = torch.optim.AdamW(params, fused=True, **kw)
        results["torch AdamW(fused=True), for reference"] = time_steps(opt, args.device, repeat)
        del opt
    for name, t in results.items():
        gbs = n * 28 / t / 1e9  # bytes moved by an ideal fused step: p, m, v read+write, g read
        print(f"{name:40s} {t * 1e3:9.2f} ms/step  ({gbs:6.1f} GB/s effective)")
    ratio = results["fairseq adam"] / results["ls_adam (fused)"]
    print(f"speedup ls_adam vs fairseq adam: {ratio:.2f}x")


if __name__ == "__main__":
    main()
