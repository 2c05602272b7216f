"""On a GPU: each op's kernels of scripts/bench_ops.py, the loss and the Adam step included, timed (device time
from CUPTI, forward and backward apart; the Adam step's one pass), beside the time the kernel profile's roofline
predicts for that GPU from the op's ideal bytes and the launches counted (a step of scripts/gpu_check.sh, so that
a lent GPU calibrates the model in the same call).

    python -m scripts.kernel_profile.gpu_times [--shapes base,large] [--dtype fp16] [--ops ...] [--json FILE]

measured / predicted near 1 means the op moves no more than its ideal bytes at the bandwidth the model
assumes; the per-kernel times in the JSON say which kernel a difference comes from.
"""
import argparse
import json
import os

from scripts import bench_ops
from scripts.bench_support import check_args
from scripts.kernel_profile import roofline
from scripts.kernel_profile.report import DTYPES, op_flops, shapes_and_dtypes


def gpu_of(name: str):
    """The roofline.GPUS entry of a device name ('NVIDIA H200' -> H200), None for another GPU."""
    return next((g for key, g in roofline.GPUS.items() if key in name), None)


def compare(op: str, p: str, nbytes: float, flops: dict, kernels: dict, gpu) -> dict:
    """One row: measured (kernels: {name: (seconds, launches)} per call) against the prediction."""
    measured = sum(t for t, _ in kernels.values())
    launches = round(sum(n for _, n in kernels.values()))
    row = dict(op=op, pass_=p, ideal_bytes=nbytes, launches=launches, measured_us=measured * 1e6,
               kernels_us={k: t * 1e6 for k, (t, _) in sorted(kernels.items(), key=lambda kv: -kv[1][0])})
    if gpu is not None:
        pr = roofline.predict(gpu, nbytes, launches, flops.get("tensor", 0.0), flops.get("fp32", 0.0))
        row.update(predicted_us=pr.seconds * 1e6, measured_over_predicted=measured / pr.seconds if pr.seconds else None,
                   bandwidth_fraction=nbytes / measured / gpu.hbm if measured > 0 else None)
    return row


def table(rows) -> str:
    out = [f"{'shape':5s} {'dtype':5s} {'op':30s} {'pass':4s} {'launch':>6s} {'measured us':>11s} "
           f"{'predicted us':>12s} {'meas/pred':>9s} {'of HBM':>7s}"]
    for r in rows:
        pred = r.get("predicted_us")
        out.append(f"{r['shape']:5s} {r['dtype']:5s} {r['op'][:30]:30s} {r['pass_']:4s} {r['launches']:6d} "
                   f"{r['measured_us']:11.1f} " + (f"{pred:12.1f} {r['measured_over_predicted']:8.2f}x "
                                                  f"{r['bandwidth_fraction']:6.0%}" if pred else f"{'-':>12s}"))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m scripts.kernel_profile.gpu_times", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="base,large")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--ops")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", help="also write the rows here")
    check_args.add(ap)
    args = ap.parse_args(argv)
    try:
        shapes, dtypes, ops = shapes_and_dtypes(args.shapes, args.dtype, args.ops)
    except ValueError as e:
        ap.error(str(e))
    import torch

    if not torch.cuda.is_available() and not args.check_args:
        ap.error("torch sees no CUDA device (this step runs on a GPU; the profile itself: python -m "
                 "scripts.kernel_profile)")
    check_args.finish(args, "kernel_profile.gpu_times")
    name = torch.cuda.get_device_name()
    gpu = gpu_of(name)
    print(f"# kernel times on {name}, torch {torch.__version__}; predictions for "
          f"{gpu.name if gpu else 'no known GPU (measured only)'}")
    rows = []
    for dname in dtypes:
        dtype, elem = getattr(torch, DTYPES[dname][0]), DTYPES[dname][1]
        for shape in shapes:
            s = bench_ops.SHAPES[shape]
            nbytes, flops = bench_ops.ideal_bytes(s, elem), op_flops(s)
            for op, inputs, grad_out, ours, *_ in bench_ops.cases(s, "cuda", dtype, elsewhere=True):
                if ops and op not in ops:
                    continue
                if grad_out is None:  # the Adam step: one pass, in place
                    passes = (("step", lambda: ours(*inputs)),)
                else:
                    y = ours(*inputs)
                    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
                    passes = (("fwd", lambda: ours(*inputs)),
                              ("bwd", lambda: torch.autograd.grad(y, leaves, grad_out, retain_graph=True)))
                for i, (p, fn) in enumerate(passes):  # ideal_bytes' order
                    k = bench_ops.kernel_launches(fn, args.repeats)
                    row = compare(op, p, nbytes[op][i], flops.get(op, {}).get(p, {}), k, gpu)
                    rows.append(dict(row, shape=shape, dtype=dname))
                y = passes = None  # the graph and its saved tensors
                torch.cuda.empty_cache()
    print(table(rows))
    if args.json:
        from scripts.bench_support.provenance import record

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(args.json, "w") as f:
            json.dump(record(dict(host=name, torch=torch.__version__, gpu=gpu._asdict() if gpu else None, rows=rows),
                             root), f, indent=1)


if __name__ == "__main__":
    main()
