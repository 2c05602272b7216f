"""python -m scripts.kernel_profile: the table (see the package's docstring)."""
import argparse
import json
import os
import sys

from scripts.kernel_profile.report import DTYPES, profile, render, shapes_and_dtypes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the emulated device's build whose kernels are observed (make emulated)
CHECKED = os.path.join(ROOT, "fairseq_lightseq", "_cuda_emulated_checked.so")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m scripts.kernel_profile", description=__doc__)
    ap.add_argument("--ops", help="comma-separated op names of scripts/bench_ops.py (default: all)")
    ap.add_argument("--shapes", default="base,big,large", help="comma-separated shapes of scripts/bench_ops.py")
    ap.add_argument("--dtype", default="fp16,bf16,fp32", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--json", help="also write the profile here")
    args = ap.parse_args(argv)
    try:
        shapes, dtypes, ops = shapes_and_dtypes(args.shapes, args.dtype, args.ops)
    except ValueError as e:
        ap.error(str(e))
    if os.environ.get("FLS_CUDA_EMULATION") != "1":
        # the emulated device is chosen when fairseq_lightseq is imported: run again with it on
        env = dict(os.environ, FLS_CUDA_EMULATION="1", OMP_NUM_THREADS="1", FLS_EMULATION_CHECKS="0",
                   FLS_CUDA_EMULATION_LIBRARY=os.environ.get("FLS_CUDA_EMULATION_LIBRARY", CHECKED))
        os.execve(sys.executable, [sys.executable, "-m", "scripts.kernel_profile", *(sys.argv[1:] if argv is None else argv)], env)
    result = profile(shapes, dtypes, ops)
    print(render(result))
    if args.json:
        from scripts.bench_support.provenance import record

        with open(args.json, "w") as f:
            json.dump(record(result, ROOT), f, indent=1)


if __name__ == "__main__":
    main()
