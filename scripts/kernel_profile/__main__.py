"""python -m scripts.kernel_profile: the table (see the package's docstring)."""
import argparse
import json
import os
import sys

from scripts.kernel_profile.report import DTYPES, profile, render, results_rows, shapes_and_dtypes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the emulated device's build whose kernels are observed (make emulated)
CHECKED = os.path.join(ROOT, "fairseq_lightseq", "_cuda_emulated_checked.so")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m scripts.kernel_profile", description=__doc__)
    ap.add_argument("--ops", help="comma-separated op names of scripts/bench_ops.py (default: all)")
    ap.add_argument("--shapes", default="base,big,large", help="comma-separated shapes of scripts/bench_ops.py")
    ap.add_argument("--dtype", default="fp16,bf16,fp32", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--json", help="also write the profile here")
    ap.add_argument("--results", metavar="RUN", help="also add the large shape's rows to benchmarks/results.csv "
                    "(with the commit; RUN: the run folder they cite, under benchmarks/runs/)")
    args = ap.parse_args(argv)
    try:
        shapes, dtypes, ops = shapes_and_dtypes(args.shapes, args.dtype, args.ops)
    except ValueError as e:
        ap.error(str(e))
    if os.environ.get("FLS_CUDA_EMULATION") != "1":
        # the emulated device is chosen when fairseq_lightseq is imported: run again with it on
        env = dict(os.environ, FLS_CUDA_EMULATION="1", OMP_NUM_THREADS="1", FLS_EMULATION_CHECKS="0",
                   FLS_CUDA_EMULATION_LIBRARY=os.environ.get("FLS_CUDA_EMULATION_LIBRARY", CHECKED))
        argv = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, "-m", "scripts.kernel_profile", *argv], env)
    result = profile(shapes, dtypes, ops)
    print(render(result))
    if args.json:
        from scripts.bench_support.provenance import record

        with open(args.json, "w") as f:
            json.dump(record(result, ROOT), f, indent=1)
    if args.results:
        add_results(results_rows(result), args.results)


def add_results(rows, run: str):
    """Appends `rows` to benchmarks/results.csv with the next ids, today's date, the commit and this machine."""
    import csv
    import datetime
    import platform
    import subprocess
    from importlib import metadata

    import torch

    path = os.path.join(ROOT, "benchmarks", "results.csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns, last = reader.fieldnames, max(int(r["id"][1:]) for r in reader)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    machine = (f"{cpu} VM, {os.cpu_count()} vCPU, torch {torch.__version__}, "
               f"fairseq-fixed {metadata.version('fairseq-fixed')}")
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, columns, lineterminator="\n")  # the file's own line ends
        for i, r in enumerate(rows, last + 1):
            w.writerow({c: "" for c in columns} | r | dict(
                id=f"r{i}", date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), commit=commit,
                machine=machine, load="emulated counts (the load does not change them)", family="kernels",
                mode="emulation", status="current", run=run))


if __name__ == "__main__":
    main()
