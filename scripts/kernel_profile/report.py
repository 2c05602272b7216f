"""The profile of bench_ops' ops, the loss and the Adam step included (launches, resources, occupancy, prediction)
as data, and its table."""
from typing import Dict, List

from scripts import bench_ops
from scripts.kernel_profile import launches as launches_mod
from scripts.kernel_profile import occupancy as occ
from scripts.kernel_profile import resources as res
from scripts.kernel_profile import roofline

DTYPES = {"fp16": ("float16", 2), "bf16": ("bfloat16", 2), "fp32": ("float32", 4)}


def shapes_and_dtypes(shapes: str, dtypes: str, ops=None):
    """The parsed --shapes, --dtype and --ops; ValueError naming the option for an unknown name."""
    s = [x for x in shapes.split(",") if x]
    d = [x for x in dtypes.split(",") if x]
    o = [x for x in (ops or "").split(",") if x]
    bad = [x for x in s if x not in bench_ops.SHAPES]
    if bad:
        raise ValueError(f"--shapes: unknown {', '.join(bad)}; choose from {', '.join(bench_ops.SHAPES)}")
    bad = [x for x in d if x not in DTYPES]
    if bad:
        raise ValueError(f"--dtype: unknown {', '.join(bad)}; choose from {', '.join(DTYPES)}")
    names = list(bench_ops.ideal_bytes(bench_ops.SHAPES["tiny"], 2))
    bad = [x for x in o if x not in names]
    if bad:
        raise ValueError(f"--ops: unknown {', '.join(bad)}; choose from {', '.join(names)}")
    return s, d, o or None


def op_flops(s: dict) -> Dict[str, Dict[str, dict]]:
    """{op: {pass: {"tensor": flops, "fp32": flops}}} for the ops whose arithmetic is not negligible beside their
    bytes: the probabilities-times-v product (cuBLAS, tensor cores) and our varlen attention (CUDA cores; the
    backward's two kernels each compute the scores again: 6 + 8 products of 2 flops)."""
    B, H, T, hd = s["tokens"] // s["seq"], s["heads"], s["seq"], s["hidden"] // s["heads"]
    L = T - T // 8
    bhtt, bhll = B * H * T * T * hd, B * H * L * L * hd
    return {"attention_softmax_dropout_bmm": {"fwd": {"tensor": 2 * bhtt}, "bwd": {"tensor": 4 * bhtt}},
            "varlen_attention": {"fwd": {"fp32": 4 * bhll}, "bwd": {"fp32": 14 * bhll}}}


def kernel_row(launch: launches_mod.Launch, resources) -> dict:
    """One launch: its configuration, memory requests (sector efficiency = requested / sector bytes; bank
    conflict = shared wavefronts / the fewest possible), and per architecture its ptxas resources and
    occupancy."""
    t = launch.traffic
    g, sh = t["global"], t["shared"]
    row = dict(kernel=launch.kernel, grid=list(launch.grid), block=list(launch.block), dynamic_smem=launch.smem,
               observed=t["observed"], requested=g["requested"], sector_bytes=32 * g["sectors"],
               unique_bytes=t["unique_bytes"],
               sector_efficiency=g["requested"] / (32 * g["sectors"]) if g["sectors"] else None,
               shared_requests=sh["requests"], bank_conflict=(sh["wavefronts"] / sh["ideal_wavefronts"]
                                                              if sh["ideal_wavefronts"] else None),
               worst_bank_conflict=sh["max_ways"] or None, worst_sites=worst_sites(t["sites"]))
    for arch, table in resources.items():
        r = table.get(launch.kernel)
        if r is None:
            row[arch] = None  # no ptxas entry of that name (the table says so)
            continue
        o = occ.occupancy(occ.ARCHS[arch], launch.threads, r.regs, r.smem + launch.smem)
        row[arch] = dict(r._asdict(), blocks_per_sm=o.blocks, warps_per_sm=o.warps, occupancy=o.fraction,
                         limit=o.limit)
    return row


def worst_sites(sites, k=3) -> list:
    """The k call sites that waste most: global bytes fetched and not requested, or shared wavefronts beyond
    the fewest, with their efficiency / conflict."""
    out = []
    for s in sites:
        t = s["totals"]
        if s["space"] == "global":
            waste, what = 32 * t["sectors"] - t["requested"], t["requested"] / max(1, 32 * t["sectors"])
        else:
            waste, what = 4 * (t["wavefronts"] - t["ideal_wavefronts"]) * 32, t["max_ways"]
        if waste > 0:
            out.append(dict(site=s["site"], space=s["space"], write=s["write"], wasted_bytes=waste,
                            efficiency=what if s["space"] == "global" else None,
                            max_ways=what if s["space"] == "shared" else None))
    return sorted(out, key=lambda x: -x["wasted_bytes"])[:k]


def profile(shapes: List[str], dtypes: List[str], ops=None, sequences: int = 2) -> dict:
    """The profile as JSON-ready data (see render for what it holds). The emulated device runs each op over
    `sequences` sequences of the shape (launches.py): the traffic ratio (sector bytes, no reuse across
    requests) and the unique ratio (every sector once) over the ideal bytes of that reduced shape; the latter
    scales the shape's ideal bytes for the prediction's DRAM traffic."""
    import torch

    resources = res.resources()
    rows, seen = [], {}
    for dname in dtypes:
        torch_dtype, elem = getattr(torch, DTYPES[dname][0]), DTYPES[dname][1]
        for shape in shapes:
            s = bench_ops.SHAPES[shape]
            small = launches_mod.reduced(s, sequences)
            key = (tuple(sorted(small.items())), dname)
            if key not in seen:  # big and large share their widths: one emulated run
                seen[key] = launches_mod.op_launches(s, torch_dtype, ops, sequences)
            nbytes, small_bytes, flops = bench_ops.ideal_bytes(s, elem), bench_ops.ideal_bytes(small, elem), op_flops(s)
            for op, passes in seen[key].items():
                entry = dict(op=op, shape=shape, dtype=dname, emulated_tokens=small["tokens"], passes={})
                if "step" in passes:  # the Adam step's sample is of the parameters, not the tokens
                    entry["emulated_params"] = bench_ops.adam_params(small)
                for i, (p, ls) in enumerate(passes.items()):  # ideal_bytes' order: fwd, bwd; or the one step
                    kernels = [kernel_row(x, resources) for x in ls]
                    sector = sum(k["sector_bytes"] for k in kernels)
                    ratio = sector / small_bytes[op][i] if small_bytes[op][i] else None
                    unique = sum(k["unique_bytes"] for k in kernels) / small_bytes[op][i] if small_bytes[op][i] else 1
                    # DRAM: every sector the kernels touch, once (re-reads of a weight row or a key tile are L1/L2
                    # hits), and never less than the ideal bytes (torch's own kernels in the op, a zero fill or a
                    # multiply, are not observed)
                    traffic = nbytes[op][i] * max(1.0, unique) if ls else 0.0  # no launch: a view
                    f = flops.get(op, {}).get(p, {})
                    pred = {}
                    for g, gpu in roofline.GPUS.items():
                        pr = roofline.predict(gpu, traffic, len(ls), f.get("tensor", 0.0), f.get("fp32", 0.0))
                        ideal = nbytes[op][i] / gpu.hbm
                        pred[g] = dict(us=pr.seconds * 1e6, bound_us=ideal * 1e6,
                                       fraction=ideal / pr.seconds if pr.seconds else None)
                    requested = sum(k["requested"] for k in kernels)
                    entry["passes"][p] = dict(
                        ideal_bytes=nbytes[op][i], emulated_ideal_bytes=small_bytes[op][i], flops=f,
                        launches=kernels, prediction=pred, traffic_ratio=ratio,
                        unique_ratio=unique,
                        sector_efficiency=requested / sector if sector else None)
                rows.append(entry)
    return dict(archs={a: occ.ARCHS[a]._asdict() for a in res.ARCHS},
                gpus={g: gpu._asdict() for g, gpu in roofline.GPUS.items()},
                emulated_sequences=sequences, rows=rows)


def _mib(b):
    return f"{b / 2**20:.1f} MiB"


def _pct(x):
    return f"{x:.0%}" if x is not None else "-"


def render(result: dict) -> str:
    """One table per op x shape x dtype: a line per kernel launch (pass, instance, block, shared memory,
    registers / spilled bytes / occupancy on sm_90 and sm_80, sector efficiency, worst shared bank conflict),
    then per pass the traffic against the ideal bytes and the prediction, and the sites that waste most."""
    out = []
    for e in result["rows"]:
        sample = (f"{e['emulated_params'] / 1e6:.1f}M parameters" if "emulated_params" in e
                  else f"{e['emulated_tokens']} tokens")
        out.append(f"\n== {e['op']}  {e['shape']}  {e['dtype']}  (emulated over {sample})")
        out.append(f"  {'pass':4s} {'kernel':46s} {'block':>5s} {'smem':>6s} {'regs':>4s} {'spill':>5s} "
                   f"{'occ90':>5s} {'occ80':>5s} {'sect.eff':>8s} {'bank':>5s}  limit (sm_90)")
        for p, d in e["passes"].items():
            for k in d["launches"]:
                a, b = k.get("sm_90"), k.get("sm_80")
                threads = k["block"][0] * k["block"][1] * k["block"][2]
                bank = f"{k['worst_bank_conflict']:.0f}-way" if k["worst_bank_conflict"] else "-"
                if a is None:
                    out.append(f"  {p:4s} {k['kernel'][:46]:46s} {threads:5d}  (no ptxas entry of this name)")
                    continue
                out.append(f"  {p:4s} {k['kernel'][:46]:46s} {threads:5d} {a['smem'] + k['dynamic_smem']:6d} "
                           f"{a['regs']:4d} {a['spill_stores'] + a['spill_loads']:5d} {a['occupancy']:5.0%} "
                           f"{(b or {}).get('occupancy', 0):5.0%} {_pct(k['sector_efficiency']):>8s} {bank:>5s}  "
                           f"{a['limit']}")
        for p, d in e["passes"].items():
            ratio = f"{d['traffic_ratio']:.2f}x" if d["traffic_ratio"] else "-"
            ratio += f" (unique {d['unique_ratio']:.2f}x)" if d["traffic_ratio"] else ""
            pr = "  ".join(f"{g} {v['us']:.1f} us ({_pct(v['fraction'])} of the {v['bound_us']:.1f} us bound)"
                           for g, v in d["prediction"].items())
            out.append(f"  {p}: ideal {_mib(d['ideal_bytes'])}, traffic {ratio} ideal, sector efficiency "
                       f"{_pct(d['sector_efficiency'])}, {len(d['launches'])} launches; {pr}")
            for k in d["launches"]:
                for w in k["worst_sites"][:1]:
                    what = (f"{w['efficiency']:.0%} sector efficiency" if w["space"] == "global"
                            else f"{w['max_ways']:.0f}-way bank conflict")
                    out.append(f"      worst site of {k['kernel'].split('<')[0]}: {w['site']} ({w['space']} "
                               f"{'store' if w['write'] else 'load'}, {what})")
    return "\n".join(out)


def results_rows(result: dict, shape: str = "large") -> List[dict]:
    """benchmarks/results.csv rows (without id, date, commit, machine, load, run) of the profile at `shape`, for
    fp16 and bf16: the predicted forward + backward time of each op on an H200 and an H100, each op's sector efficiency,
    its traffic ratio (sector bytes over ideal bytes) and its unique ratio, the ops in bench_ops' order (the Adam
    step's one pass stands for forward + backward)."""
    out = []
    for dtype in ("fp16", "bf16"):  # the targets' dtypes
        rows = [r for r in result["rows"] if r["shape"] == shape and r["dtype"] == dtype]
        if not rows:
            continue
        ops = " / ".join(r["op"] for r in rows)
        where = (f"bench_ops {shape} ({bench_ops.SHAPES[shape]['tokens']} tokens), {dtype}, emulated over "
                 f"{rows[0]['emulated_tokens']} tokens; ops {ops}")

        def each(f):
            return " / ".join(f(r) for r in rows)

        def both(r, key):
            p = [x for x in r["passes"].values() if x["launches"]]
            req = sum(k["requested"] for x in p for k in x["launches"])
            sec = sum(k["sector_bytes"] for x in p for k in x["launches"])
            uni = sum(k["unique_bytes"] for x in p for k in x["launches"])
            ideal = sum(x["emulated_ideal_bytes"] for x in p)
            return {"eff": req / sec if sec else 0.0, "traffic": sec / ideal if ideal else 0.0,
                    "unique": uni / ideal if ideal else 0.0}[key]

        for gpu in ("H200", "H100"):
            def us(r, gpu=gpu):
                return f"{sum(x['prediction'][gpu]['us'] for x in r['passes'].values()):.1f}"

            out.append(dict(shape=where, metric=f"predicted kernel time, forward + backward, {gpu}", unit="us",
                            ls=each(us),
                            note="roofline of scripts/kernel_profile/roofline.py on the emulated traffic"))
        out.append(dict(shape=where, metric="sector efficiency (requested / sector bytes), forward + backward",
                        unit="%", ls=each(lambda r: f"{100 * both(r, 'eff'):.0f}"), note=""))
        out.append(dict(shape=where, metric="traffic ratio (sector bytes, no reuse / ideal bytes), forward + backward",
                        unit="x", ls=each(lambda r: f"{both(r, 'traffic'):.2f}"),
                        note="unique ratio (every sector once): " + each(lambda r: f"{both(r, 'unique'):.2f}")))
    return out
