"""Training speed, ls_transformer vs fairseq's transformer, measured at steady state on identical batches.

    python scripts/benchmark.py                        # CPU (no GPU): base width, 2+2 layers, fp32
    python scripts/benchmark.py --device cuda          # GPU: Transformer-big fp16 at 8192 tokens (~4 min)
    python scripts/benchmark.py --device cuda --sweep --precision fp16,bf16   # 4096..32768 tokens
    python scripts/benchmark.py --host-overhead        # host time per step: tiny width, big depth, 1 thread
    python scripts/benchmark.py --activation-bytes     # bytes saved for backward, base and big, 6+6
    python scripts/benchmark.py --repo /path/to/other/checkout ...   # benchmark that tree's fairseq_lightseq

Method (throughput, the default mode):
- Data: a WMT-like synthetic corpus (1M pairs, fixed 32k dictionary; bench_support/corpus.py), made
  once and cached under --cache-dir, or any --data-bin. For each --max-tokens, a pool of --pool batches
  is drawn once from fairseq's own loader (get_batch_iterator, length-bucketed, shuffled with seed 1)
  and saved; every side trains on exactly these batches.
- Sides (bench_support/sides.py): ls = ls_transformer + ls criterion + ls_adam; fairseq = transformer +
  label_smoothed_cross_entropy + fairseq's adam, as users run it; fairseq_fused = the same with
  torch's fused AdamW registered by the benchmark (bench_support/fused_adamw.py).
- Each side runs in its own process, in turns (round 1: ls, fairseq, fairseq_fused; round 2: the same
  order; ...). A process builds fairseq's Trainer, warms up --warmup steps over the pool, then times
  its share of the timed step list: the list is steps 0..--steps-1 (step k trains on pool batch
  k mod pool), split into --rounds consecutive parts, part r timed in round r. What one timed step is:
  see bench_support/timing.py (fairseq's Trainer.train_step; CUDA events on GPU, perf_counter on CPU).
- Reported per side: sum(target tokens) / sum(step times) over the identical step list; the median
  and interquartile range of the per-step speed ratio t(baseline) / t(ls); MFU = model FLOPs over
  non-pad tokens (bench_support/flops.py) / time / device peak (fp16/bf16 table for A100/H100/H200,
  --peak-tflops otherwise; n/a on CPU without it); the pool's pad fraction; skipped updates (fp16
  overflow); GPU only: activation memory (peak inside task.train_step minus the memory allocated
  before its forward, at --memory-at tokens), host-device syncs per step, GPU-busy fraction.

--host-overhead: d=32, FFN 64, 2 heads, 6+6 layers (Transformer-big depth, dropout 0.3), one thread,
a 1k-word corpus and --max-tokens 512, so kernels do almost nothing and a step's time is host time:
median ms per step of ls vs fairseq in turns, plus torch.profiler's top ops by self CPU time with calls
per step, against the target ls <= 0.5x fairseq.

--activation-bytes: bytes autograd saves for backward in one training forward (dropout on, fp32) on
the first batch of a --max-tokens 4096 pool, ls vs fairseq, Transformer-base and -big widths, 6+6
layers (bench_support/saved_bytes.py says how storages are counted), against the target <= 0.6x.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_support import check_args

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
TINY_WIDTH = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
              "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
HOST_TARGET, ACT_TARGET = 0.5, 0.6


def run_child(kind: str, spec: dict, repo: str, threads=None) -> dict:
    """Runs `kind` (side | act) in a fresh process; returns its result."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
        [repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", kind, json.dumps(spec)],
                       capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"benchmark child {kind} failed ({' '.join(spec.get('args', []))}):\n"
                       f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def child_main(kind: str, spec: dict) -> None:
    import logging

    logging.disable(logging.WARNING)
    if kind == "side":
        from bench_support.timing import run_side
        res = run_side(spec)
    else:
        from bench_support.saved_bytes import forward_saved_bytes
        if spec.get("ls_attention") == "sdpa":  # ls's attention as on a GPU (no effect on fairseq's side)
            from fairseq_lightseq.modules import multihead_attention
            multihead_attention.SDPA_MODE = "always"
        res = forward_saved_bytes(spec["args"], spec["pool"])
    print("RESULT " + json.dumps(res), flush=True)


def quartiles(xs):
    """(q1, median, q3) of xs (statistics.quantiles, inclusive method)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def make_pools(a, data_bin: str, sizes, tmp: str, n_pool: int, layers, extra):
    """{max_tokens: (path, pool)}: one pool per size from fairseq's loader (the ls side's arguments;
    batching depends only on the data and --max-tokens)."""
    import torch

    from bench_support.corpus import draw_pool

    pools = {}
    for mt in sizes:
        args = train_args_for(a, data_bin, "fairseq", "fp32", mt, layers, extra)
        pool = draw_pool(args, n_pool)
        path = os.path.join(tmp, f"pool{mt}.pt")
        torch.save(pool, path)
        pools[mt] = (path, pool)
    return pools


def train_args_for(a, data_bin, side, precision, max_tokens, layers, extra):
    from bench_support.sides import ARCHS, train_args
    return train_args(data_bin, a.repo, side, ARCHS[a.arch_size], a.device, precision, max_tokens, layers, extra)


def data_bin_for(a, n_pairs: int, vocab: int) -> str:
    if a.data_bin:
        return a.data_bin
    from bench_support.corpus import synthetic_data_bin

    t0 = time.perf_counter()
    d = synthetic_data_bin(a.cache_dir, n_pairs, vocab)
    print(f"data-bin: {d} ({n_pairs} synthetic pairs, {vocab}-entry dictionary; "
          f"{time.perf_counter() - t0:.0f} s incl. cache check)", flush=True)
    return d


def timed_rounds(a, sides, spec_for, rounds: int, threads):
    """Runs every side once per round, in turns; returns {side: [round results]}."""
    out = {s: [] for s in sides}
    for r in range(rounds):
        for side in sides:
            t0 = time.perf_counter()
            out[side].append(run_child("side", spec_for(side, r), a.repo, threads))
            print(f"  round {r + 1}/{rounds} {side}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def step_split(steps: int, rounds: int):
    """Consecutive parts of range(steps), one per round."""
    cuts = [round(steps * r / rounds) for r in range(rounds + 1)]
    return [(cuts[r], cuts[r + 1]) for r in range(rounds)]


def summarize(sides, runs, pool, steps, key: str, flops_of=None, peak=None) -> dict:
    """Per side, over the identical step list: tokens/s, median ms, MFU, per-step ratio vs ls."""
    tokens = [pool[k % len(pool)]["ntokens"] for k in range(steps)]
    times = {s: [t for r in runs[s] for t in r["pools"][key]["times"]] for s in sides}
    out = {}
    for s in sides:
        t = times[s]
        row = {"tgt_tokens_per_s": sum(tokens) / sum(t), "median_ms": statistics.median(t) * 1e3,
               "step_ms": [x * 1e3 for x in t], "optimizer_class": runs[s][0]["optimizer"],
               "target_checksum": sum(r["pools"][key]["target_checksum"] for r in runs[s]),
               "per_round_tokens_per_s": [], "skipped": sum(r["pools"][key]["skipped"] for r in runs[s])}
        i = 0
        for r in runs[s]:
            n = len(r["pools"][key]["times"])
            row["per_round_tokens_per_s"].append(sum(tokens[i:i + n]) / max(sum(r["pools"][key]["times"]), 1e-12))
            i += n
        if flops_of is not None:
            flops = sum(flops_of(pool[k % len(pool)]) for k in range(steps))
            row["tflops_per_s"] = flops / sum(t) / 1e12
            row["mfu"] = row["tflops_per_s"] / peak if peak else None
        for extra in ("memory", "syncs", "busy_fraction", "loss_scale", "ops"):
            vals = [r["pools"][key][extra] for r in runs[s] if extra in r["pools"][key]]
            if vals:
                row[extra] = vals[-1]
        if s != "ls" and "ls" in times:
            ratios = [b / l for b, l in zip(t, times["ls"])]
            q1, q2, q3 = quartiles(ratios)
            row["ls_speedup_sum"] = sum(t) / sum(times["ls"])  # = ls tokens/s over this side's
            row["ls_speedup_per_step"] = {"median": q2, "q1": q1, "q3": q3}
        out[s] = row
    return {"step_tgt_tokens": tokens, "sides": out}


def fmt(x, spec, na="n/a"):
    return na if x is None else format(x, spec)


def throughput(a) -> dict:
    from bench_support.corpus import pad_fraction
    from bench_support.flops import batch_flops, device_peak_tflops

    cuda = a.device == "cuda"
    sizes = [4096, 8192, 16384, 32768] if a.sweep else a.max_tokens
    memory_at = [m for m in a.memory_at if cuda]
    extra_mem = [m for m in memory_at if m not in sizes]  # memory-only pools: a few untimed steps
    data_bin = data_bin_for(a, a.corpus_pairs, a.vocab)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_")
    extra = a.extra.split()
    pools = make_pools(a, data_bin, sorted(set(sizes) | set(extra_mem)), tmp.name, a.pool, a.layers, extra)
    parts = step_split(a.steps, a.rounds)
    print(f"device {a.device}; {a.arch_size} ({'arch layers' if not a.layers else f'{a.layers}+{a.layers} layers'})"
          f"{'; extra: ' + a.extra if a.extra else ''}; sides {', '.join(a.sides)}; pool {a.pool} batches per "
          f"size; warm-up {a.warmup} steps; {a.steps} timed steps per side in {a.rounds} rounds of "
          f"{', '.join(str(e - s) for s, e in parts)}; repo {a.repo}", flush=True)
    results = {"mode": "throughput", "device": a.device, "arch_size": a.arch_size, "layers": a.layers,
               "extra": a.extra, "pool": a.pool, "warmup": a.warmup, "steps": a.steps, "rounds": a.rounds,
               "sides": a.sides, "data_bin": data_bin, "repo": a.repo, "precisions": {}}
    for prec in a.precision:
        def spec_for(side, r, prec=prec):
            lo, hi = parts[r]
            pl = [[mt, pools[mt][0]] for mt in sizes]
            spec = {"args": train_args_for(a, data_bin, side, prec, sizes[0], a.layers, extra),
                    "pools": pl, "warmup": a.warmup, "steps": hi - lo, "first_step": lo,
                    "memory_at": memory_at, "syncs": cuda and r == a.rounds - 1 and not a.no_syncs,
                    "busy_at": (8192 if 8192 in sizes else sizes[0]) if cuda and r == a.rounds - 1 else None,
                    "threads": a.threads}
            if r == a.rounds - 1:
                spec["pools"] = pl + [[mt, pools[mt][0], 3, 0] for mt in extra_mem]  # 3 warm-up steps, untimed
            return spec

        print(f"[{prec}]", flush=True)
        runs = timed_rounds(a, a.sides, spec_for, a.rounds, a.threads)
        first = runs[a.sides[0]][0]
        shape = first["model"]
        peak = device_peak_tflops(first["device"], prec, a.peak_tflops)
        rows = {}
        for mt in sizes:
            pool = pools[mt][1]
            rows[str(mt)] = {"pad_fraction": pad_fraction(pool),
                             **summarize(a.sides, runs, pool, a.steps, str(mt), lambda b: batch_flops(b, shape), peak)}
        for mt in extra_mem:
            rows[str(mt)] = {"memory_only": True, "sides": {
                s: {"memory": runs[s][-1]["pools"][str(mt)].get("memory")} for s in a.sides}}
        results["precisions"][prec] = {"device_name": first["device"], "peak_tflops": peak,
                                       "num_params": first["num_params"], "model": shape,
                                       "threads": first["threads"], "max_tokens": rows}
        print_throughput(prec, results["precisions"][prec], a.sides)
    return results


def print_throughput(prec, res, sides):
    print(f"[{prec}] {res['device_name']}, {res['num_params'] / 1e6:.1f}M params, peak "
          f"{fmt(res['peak_tflops'], '.0f')} TFLOP/s, {res['threads']} threads", flush=True)
    print("torch optimizer classes: " + ", ".join(
        f"{s} {next(iter(res['max_tokens'].values()))['sides'][s].get('optimizer_class')}" for s in sides), flush=True)
    hdr = (f"{'max-tok':>8} {'side':<14}{'tgt tok/s':>11}{'med ms':>9}{'TFLOP/s':>9}{'MFU':>7}"
           f"{'ls speedup':>11}{'per-step median [IQR]':>24}{'skip':>5}  per-round tok/s")
    print(hdr, flush=True)
    for mt, row in res["max_tokens"].items():
        if row.get("memory_only"):
            continue
        for s in sides:
            r = row["sides"][s]
            sp = r.get("ls_speedup_per_step")
            per_step = f"{sp['median']:.2f} [{sp['q1']:.2f}, {sp['q3']:.2f}]" if sp else ""
            print(f"{mt:>8} {s:<14}{r['tgt_tokens_per_s']:>11.0f}{r['median_ms']:>9.1f}"
                  f"{r['tflops_per_s']:>9.3f}{fmt(r['mfu'], '.1%'):>7}"
                  f"{fmt(r.get('ls_speedup_sum'), '.2f', ''):>10}{'x' if sp else ' '}{per_step:>24}"
                  f"{r['skipped']:>5}  {', '.join(f'{x:.0f}' for x in r['per_round_tokens_per_s'])}",
                  flush=True)
        pf = row["pad_fraction"]
        print(f"{mt:>8} pad fraction: src {pf['src']:.3f}, tgt {pf['tgt']:.3f}, all {pf['all']:.3f}", flush=True)
    for mt, row in res["max_tokens"].items():
        for s in sides:
            r = row["sides"][s]
            if r.get("memory"):
                m = r["memory"]
                print(f"{mt:>8} {s:<14} activation memory {m['activations'] / 2**20:.0f} MiB (peak in "
                      f"task.train_step {m['in_step'] / 2**20:.0f} MiB above the {m['static'] / 2**20:.0f} MiB "
                      f"allocated before forward; gradients {m['grad_bytes'] / 2**20:.0f} MiB "
                      f"{'already allocated' if m['grads_allocated_before'] else 'subtracted'})", flush=True)
            if r.get("syncs"):
                y = r["syncs"]
                print(f"{mt:>8} {s:<14} syncs per step: {y['train_step_total']} in Trainer.train_step, "
                      f"{y['model_criterion_fwd_bwd']} in forward+backward, {y['optimizer_step']} in the "
                      f"optimizer step", flush=True)
            if r.get("busy_fraction") is not None:
                print(f"{mt:>8} {s:<14} GPU busy {100 * r['busy_fraction']:.1f}% of a 5-step profiler trace",
                      flush=True)


def host_overhead(a) -> dict:
    if "ls" not in a.sides or len(a.sides) < 2:
        raise SystemExit(f"--host-overhead compares ls with a baseline: --sides must name ls and fairseq or "
                         f"fairseq_fused, got {','.join(a.sides)}")
    a.arch_size, a.device = "big", "cpu"
    data_bin = data_bin_for(a, a.host_pairs, a.host_vocab)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_host_")
    extra = TINY_WIDTH + a.extra.split()
    mt = a.max_tokens[0]
    pools = make_pools(a, data_bin, [mt], tmp.name, a.pool, None, extra)
    parts = step_split(a.steps, a.rounds)
    print(f"host overhead: {a.arch_size} depth (6+6), d=32, FFN 64, 2 heads, max-tokens {mt}, fp32, 1 thread; "
          f"pool {a.pool}; warm-up {a.warmup}; {a.steps} timed steps per side in {a.rounds} rounds; "
          f"repo {a.repo}", flush=True)

    def spec_for(side, r):
        lo, hi = parts[r]
        return {"args": train_args_for(a, data_bin, side, "fp32", mt, None, extra),
                "pools": [[mt, pools[mt][0]]], "warmup": a.warmup, "steps": hi - lo, "threads": 1,
                "first_step": lo, "ops_steps": a.ops_steps if r == a.rounds - 1 else 0, "ops_top": a.ops_top}

    runs = timed_rounds(a, a.sides, spec_for, a.rounds, 1)
    summary = summarize(a.sides, runs, pools[mt][1], a.steps, str(mt))
    rows = summary["sides"]
    base = "fairseq" if "fairseq" in a.sides else a.sides[-1]
    ratio = rows["ls"]["median_ms"] / rows[base]["median_ms"]
    print(f"{'side':<14}{'median ms/step':>15}{'op calls/step':>15}{'bwd nodes/step':>16}", flush=True)
    for s in a.sides:
        r = rows[s]
        o = r.get("ops", {})
        print(f"{s:<14}{r['median_ms']:>15.2f}{fmt(o.get('op_calls_per_step'), '.0f'):>15}"
              f"{fmt(o.get('backward_nodes_per_step'), '.0f'):>16}", flush=True)
    sp = rows[base]["ls_speedup_per_step"]
    print(f"host time per step, ls / {base}: {ratio:.2f}x (target <= {HOST_TARGET}x: "
          f"{'met' if ratio <= HOST_TARGET else 'NOT met'}); per-step {base}/ls speed ratio median "
          f"{sp['median']:.2f} [IQR {sp['q1']:.2f}, {sp['q3']:.2f}]", flush=True)
    for s in a.sides:
        o = rows[s].get("ops")
        if not o:
            continue
        for key, what in (("top", "self CPU time"), ("top_by_calls", "calls")):
            print(f"-- {s}: top entries by {what} (torch.profiler, {a.ops_steps} steps; per step; profiled "
                  f"self CPU {o['self_cpu_ms_per_step']:.1f} ms/step)", flush=True)
            for e in o[key]:
                print(f"   {e['name'][:60]:<60}{e['self_cpu_ms_per_step']:>9.2f} ms{e['calls_per_step']:>8.0f} calls",
                      flush=True)
    return {"mode": "host_overhead", "max_tokens": mt, "data_bin": data_bin, "repo": a.repo, "steps": a.steps,
            "warmup": a.warmup, "rounds": a.rounds, "ls_over_base": ratio, "base": base, "target": HOST_TARGET,
            **summary}


def activation_bytes(a) -> dict:
    a.device = "cpu"
    data_bin = data_bin_for(a, a.corpus_pairs, a.vocab)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_act_")
    mt = a.max_tokens[0]
    extra = a.extra.split()
    out = {"mode": "activation_bytes", "max_tokens": mt, "data_bin": data_bin, "repo": a.repo,
           "ls_attention": a.ls_attention, "sizes": {}}
    print(f"{'width':<6}{'side':<10}{'saved MiB':>11}{'storages':>10}{'ctx-attr MiB':>14}{'batch':>12}", flush=True)
    for size in a.act_sizes:
        a.arch_size = size
        pool_path = make_pools(a, data_bin, [mt], tmp.name, 1, a.layers, extra)[mt][0]
        row = {}
        for side in ("ls", "fairseq"):
            args = train_args_for(a, data_bin, side, "fp32", mt, a.layers, extra)
            row[side] = run_child("act", {"args": args, "pool": pool_path, "ls_attention": a.ls_attention},
                                  a.repo, a.threads)
            r = row[side]
            print(f"{size:<6}{side:<10}{r['bytes'] / 2**20:>11.1f}{r['storages']:>10}"
                  f"{r['from_ctx_attributes'] / 2**20:>14.1f}{'x'.join(map(str, r['batch'])):>12}", flush=True)
        for side in ("ls", "fairseq"):
            print(f"      largest {side} groups: " + "; ".join(
                f"{k} x{c}: {n / 2**20:.0f} MiB" for n, c, k in row[side]["largest"][:6]), flush=True)
        row["ratio"] = row["ls"]["bytes"] / row["fairseq"]["bytes"]
        print(f"{size:<6}ls / fairseq {row['ratio']:.2f}x (target <= {ACT_TARGET}x: "
              f"{'met' if row['ratio'] <= ACT_TARGET else 'NOT met'}); {row['ls']['src_tokens']} source + "
              f"{row['ls']['tgt_tokens']} target tokens", flush=True)
        out["sizes"][size] = row
    return out


def machine(load_before) -> dict:
    """What ran the benchmark: CPU model and count, load averages, versions."""
    import platform

    import fairseq
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"cpu": cpu, "nproc": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "torch": torch.__version__, "fairseq": fairseq.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    strs = lambda s: s.split(",")  # noqa: E731
    p.add_argument("--host-overhead", action="store_true", help="the host-time mode (see below)")
    p.add_argument("--activation-bytes", action="store_true", help="the saved-bytes mode (see below)")
    p.add_argument("--repo", default=ROOT, help="the checkout whose fairseq_lightseq is benchmarked "
                   "(default: the one holding this script)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    p.add_argument("--data-bin", help="any fairseq translation data-bin with a joined dictionary "
                   "(default: the synthetic WMT-like corpus)")
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "fls_bench_cache"),
                   help="where the synthetic corpus is made once and reused (default: %(default)s)")
    p.add_argument("--corpus-pairs", type=int, default=1_000_000, help="synthetic corpus size (pairs)")
    p.add_argument("--vocab", type=int, default=32000, help="synthetic dictionary size incl. specials")
    p.add_argument("--arch-size", choices=["base", "big"], help="default: base on CPU, big on CUDA")
    p.add_argument("--layers", type=int, help="encoder and decoder layers (default: 2 on CPU, the arch's on CUDA)")
    p.add_argument("--precision", type=strs, help="comma list of fp32,fp16,bf16 (default: fp32 on CPU, fp16 on CUDA)")
    p.add_argument("--max-tokens", type=ints, help="comma list (default: 1024 on CPU, 8192 on CUDA; "
                   "--host-overhead 512; --activation-bytes 4096)")
    p.add_argument("--sweep", action="store_true", help="--max-tokens 4096,8192,16384,32768")
    p.add_argument("--pool", type=int, default=100, help="batches per pool (default: %(default)s)")
    p.add_argument("--warmup", type=int, help="untimed steps over the pool per process (default: 50 on CUDA, "
                   "5 on CPU, 20 for --host-overhead)")
    p.add_argument("--steps", type=int, help="timed steps per side (default: 100; --host-overhead 150)")
    p.add_argument("--rounds", type=int, help="turns per side, the timed steps split among them "
                   "(default: 2 on CUDA, 4 on CPU, 3 for --host-overhead)")
    p.add_argument("--sides", type=strs, help="comma list of ls,fairseq,fairseq_fused (default: all three; "
                   "--host-overhead: ls,fairseq)")
    p.add_argument("--memory-at", type=ints, default=[8192, 32768], help="CUDA: max-tokens at which to "
                   "measure activation memory (default: %(default)s)")
    p.add_argument("--no-syncs", action="store_true", help="CUDA: skip counting host-device syncs")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU when not in the table (or on CPU)")
    p.add_argument("--threads", type=int, help="torch threads in the children (default: torch's)")
    p.add_argument("--extra", default="", help="more fairseq-train arguments for every side, quoted")
    p.add_argument("--host-pairs", type=int, default=20000, help="--host-overhead corpus pairs")
    p.add_argument("--host-vocab", type=int, default=1000, help="--host-overhead dictionary size")
    p.add_argument("--ops-steps", type=int, default=20, help="--host-overhead: profiled steps")
    p.add_argument("--ops-top", type=int, default=15, help="--host-overhead: ops listed per side")
    p.add_argument("--act-sizes", type=strs, default=["base", "big"], help="--activation-bytes widths")
    p.add_argument("--ls-attention", choices=["auto", "sdpa"], default="auto",
                   help="--activation-bytes: ls attention path; sdpa = the GPU's (torch's fused attention, "
                        "as fairseq's side runs it on the CPU too), auto = the device's (explicit on CPU)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    check_args.add(p)
    a = p.parse_args(argv)
    if a._child:
        return a
    a.repo = os.path.abspath(a.repo)
    if not os.path.isdir(os.path.join(a.repo, "fairseq_lightseq")):
        p.error(f"--repo {a.repo}: no fairseq_lightseq/ there")
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu = a.device == "cpu"
    host = a.host_overhead
    a.arch_size = a.arch_size or ("base" if cpu else "big")
    if a.layers is None and cpu and not host and not a.activation_bytes:
        a.layers = 2
    a.precision = a.precision or (["fp32"] if cpu else ["fp16"])
    a.max_tokens = a.max_tokens or ([512] if host else [4096] if a.activation_bytes else [1024] if cpu else [8192])
    a.warmup = a.warmup if a.warmup is not None else (20 if host else 5 if cpu else 50)
    a.steps = a.steps or (150 if host else 100)
    a.rounds = a.rounds or (3 if host else 4 if cpu else 2)
    a.sides = a.sides or (["ls", "fairseq"] if host else ["ls", "fairseq", "fairseq_fused"])
    for name, val, lo in (("--pool", a.pool, 1), ("--steps", a.steps, 1), ("--rounds", a.rounds, 1),
                          ("--warmup", a.warmup, 0)):
        if val < lo:
            p.error(f"{name} {val}: must be >= {lo}")
    if a.rounds > a.steps:
        p.error(f"--rounds {a.rounds}: at most --steps ({a.steps}), each round times at least one step")
    if [x for x in a.precision if x not in ("fp32", "fp16", "bf16")]:
        p.error(f"--precision {','.join(a.precision)}: a comma list of fp32,fp16,bf16")
    bad = [s for s in a.sides if s not in ("ls", "fairseq", "fairseq_fused")]
    if bad or "ls" not in a.sides:
        p.error(f"--sides {','.join(a.sides)}: a comma list of ls,fairseq,fairseq_fused that includes ls")
    if not cpu and not a.check_args:
        import torch
        if not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device")
    return a


def main(argv=None):
    sys.path.insert(0, SCRIPTS)
    a = parse_args(argv)
    if a._child:
        child_main(a._child[0], json.loads(a._child[1]))
        return
    check_args.finish(a, "benchmark.py")
    sys.path.insert(0, a.repo)
    import logging
    import warnings
    logging.disable(logging.WARNING)  # fairseq's INFO lines
    warnings.filterwarnings("ignore")  # hydra's deprecation notes on every config
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    res = host_overhead(a) if a.host_overhead else activation_bytes(a) if a.activation_bytes else throughput(a)
    res["wall_s"] = time.perf_counter() - t0
    res["machine"] = machine(load_before)
    res["argv"] = sys.argv[1:] if argv is None else list(argv)
    m = res["machine"]
    print(f"done in {res['wall_s']:.0f} s; {m['nproc']} x {m['cpu']}; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.1f}' for x in m['loadavg_before'])}, after "
          f"{', '.join(f'{x:.1f}' for x in m['loadavg_after'])}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
