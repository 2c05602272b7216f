"""The kernel profile's predictions beside a GPU measurement of bench_ops (`bench_ops --device cuda --json`):

    python -m scripts.kernel_profile.compare GPU_JSON PROFILE_JSON [--gpu H200]

A markdown table per shape: op, pass, the measured kernel time (the op's bytes over the achieved bandwidth
the JSON records), the predicted time, their ratio. The JSON's bandwidth fractions are of its own copy
bandwidth and its bytes are bench_ops' yardstick of its commit: BYTES_THEN names where that differed.
"""
import argparse
import json

from scripts import bench_ops

# bench_ops' yardstick at the 2026-11-29 runs where it differs from today's ideal_bytes: the embedding's
# backward counted the gradient read and written once, not the dense table gradient.
BYTES_THEN = {"embedding": lambda s, e: (2 * s["tokens"] * s["hidden"] * e, 2 * s["tokens"] * s["hidden"] * e)}


def rows(gpu: dict, profile: dict, which: str = "H200"):
    """[(shape, op, pass, measured us, predicted us)] for every op and pass both hold."""
    e = {"fp16": 2, "bf16": 2, "fp32": 4}[gpu["dtype"]]
    pred = {(r["shape"], r["op"]): r for r in profile["rows"] if r["dtype"] == gpu["dtype"]}
    out = []
    for r in gpu["rows"]:
        p = pred.get((r["shape"], r["op"]))
        if p is None:
            continue
        s = bench_ops.SHAPES[r["shape"]]
        nbytes = BYTES_THEN.get(r["op"], lambda s, e: bench_ops.ideal_bytes(s, e)[r["op"]])(s, e)
        for i, ps in enumerate(("fwd", "bwd")):
            frac = r.get(f"{ps}_bw_frac")
            if frac:
                measured = nbytes[i] / (frac * gpu["copy_bw"]) * 1e6
                out.append((r["shape"], r["op"], ps, measured, p["passes"][ps]["prediction"][which]["us"]))
    return out


def markdown(table) -> str:
    lines = ["| shape | op | pass | measured us | predicted us | measured / predicted |", "|---|---|---|---|---|---|"]
    for shape, op, ps, m, p in table:
        ratio = f"{m / p:.2f}" if p else "no kernel now"  # a pass that became a view
        lines.append(f"| {shape} | {op} | {ps} | {m:.1f} | {p:.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gpu_json")
    ap.add_argument("profile_json")
    ap.add_argument("--gpu", default="H200")
    a = ap.parse_args(argv)
    with open(a.gpu_json) as f, open(a.profile_json) as g:
        print(markdown(rows(json.load(f), json.load(g), a.gpu)))


if __name__ == "__main__":
    main()
