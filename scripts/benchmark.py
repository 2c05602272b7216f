"""Training speed, ls_ models vs fairseq's, measured at steady state on identical batches, per model family.

    python -m scripts.benchmark                        # CPU (no GPU): translation, base width, 2+2 layers, fp32
    python -m scripts.benchmark --device cuda          # GPU: Transformer-big fp16 at 8192 tokens (~4 min)
    python -m scripts.benchmark --device cuda --sweep --precision fp16,bf16   # 4096..32768 tokens
    python -m scripts.benchmark --host-overhead        # host time per step: tiny width, big depth, 1 thread
    python -m scripts.benchmark --activation-bytes     # bytes saved for backward, base and big, 6+6
    python -m scripts.benchmark --family lm            # the LM on CPU: transformer_lm width, 4 layers, T=512
    python -m scripts.benchmark --family lm --device cuda   # GPU: GPT-2-small widths, bf16, T=1024 and 4096
    python -m scripts.benchmark --family lm --host-overhead       # d=32, 12 layers, 1 thread
    python -m scripts.benchmark --family lm --activation-bytes    # base and GPT-2-small widths, T=512 and 2048
    python -m scripts.benchmark --family roberta       # RoBERTa pretraining on CPU: roberta_base width, 4 layers, T=512
    python -m scripts.benchmark --family roberta --device cuda    # GPU: roberta_base, bf16, T=512 at 16k tokens
    python -m scripts.benchmark --family roberta --host-overhead  # d=32, 12 layers, 1 thread
    python -m scripts.benchmark --family roberta --activation-bytes   # roberta_base and _large widths, T=512
    python -m scripts.benchmark --packed               # --ls-packed True vs False vs fairseq on Multi30k, 1 thread
    python -m scripts.benchmark --packed --cases sweep # only the padding sweep
    python -m scripts.benchmark --repo /path/to/other/checkout ...   # benchmark that tree's fairseq_lightseq

Families (--family; bench_support/families.py is the one table: task, archs, the family's fairseq-train
arguments, corpus, defaults): translation = ls_transformer vs transformer on a WMT-like corpus; lm =
ls_transformer_lm vs transformer_lm (language_modeling, blocks of --seq-len T tokens, --sample-break-mode
none, shared input/output embedding) on a synthetic text corpus binarized by fairseq-preprocess
--only-source; roberta = ls_roberta_base vs roberta_base (masked_lm pretraining: the same corpus, the task
adds <mask> and masks 15% of the tokens; blocks of exactly --seq-len T tokens, --sample-break-mode none;
ls_masked_lm vs masked_lm). Every mode below runs for every family; "sentence"/"target tokens" mean the
LM's blocks and predicted tokens, and RoBERTa's blocks and its input tokens: a family's tokens/s counts
the task's own ntokens (families.py `tokens`: target tokens for translation and the LM, every input
token, masked or not, for RoBERTa, the usual pretraining figure; the JSON key stays tgt_tokens_per_s).

Method (throughput, the default mode):
- Data: a synthetic corpus (translation: 1M WMT-like pairs, fixed 32k dictionary; lm: 200k lines of
  the same words, fixed 50264-entry dictionary; bench_support/corpus.py), made once and cached under
  --cache-dir, or any --data-bin (roberta: the lm's corpus). For each --max-tokens (lm, roberta: at each
  --seq-len), a pool of --pool
  batches is drawn once from fairseq's own loader (get_batch_iterator: length-bucketed sentences or
  the LM's token blocks, shuffled with seed 1) and saved; every side trains on exactly these batches.
- Sides (bench_support/sides.py): ls = the ls_ model + our criterion + ls_adam; fairseq = fairseq's
  model + its criterion (label_smoothed_cross_entropy / cross_entropy / masked_lm) + fairseq's adam, as users run
  it; fairseq_fused = the same with torch's fused AdamW registered by the benchmark
  (bench_support/fused_adamw.py).
- Each side runs in its own process, in turns (round 1: ls, fairseq, fairseq_fused; round 2: the same
  order; ...; bench_support/children.py: on the CPU forked from a server that imported torch and fairseq
  once, on CUDA a new interpreter). A process builds fairseq's Trainer, warms up --warmup steps over the pool, then times
  its share of the timed step list: the list is steps 0..--steps-1 (step k trains on pool batch
  k mod pool), split into --rounds consecutive parts, part r timed in round r. What one timed step is:
  see bench_support/timing.py (fairseq's Trainer.train_step; CUDA events on GPU, perf_counter on CPU).
- Reported per side: sum(target tokens) / sum(step times) over the identical step list; the median
  and interquartile range of the per-step speed ratio t(baseline) / t(ls); MFU = model FLOPs over
  non-pad tokens (bench_support/flops.py) / time / device peak (fp16/bf16 table for A100/H100/H200,
  --peak-tflops otherwise; n/a on CPU without it); the pool's pad fraction; skipped updates (fp16
  overflow); GPU only: activation memory (peak inside task.train_step minus the memory allocated
  before its forward, at --memory-at tokens), host-device syncs per step, GPU-busy fraction.

--host-overhead: d=32, FFN 64, 2 heads, the family's deep arch (translation: 6+6 layers, Transformer-big
depth, dropout 0.3, --max-tokens 512; lm: 12 layers, GPT-2-small depth, dropout 0.1, 4 blocks of T=128; roberta: 12 layers, roberta_base
depth, dropout 0.1, 4 blocks of T=128),
one thread, a 1k-word corpus, so kernels do almost nothing and a step's time is host time:
median ms per step of ls vs fairseq in turns, plus torch.profiler's top ops by self CPU time with calls
per step, against the target ls <= 0.5x fairseq.

--activation-bytes: bytes autograd saves for backward in one training forward (dropout on, fp32) on
the first batch of a pool, ls vs fairseq (bench_support/saved_bytes.py says how storages are counted),
against the target <= 0.6x: translation, --max-tokens 4096, Transformer-base and -big widths, 6+6
layers; lm, --max-tokens 2048 at T = 512 and 2048 (4 blocks, 1 block), transformer_lm (6 layers) and
GPT-2-small (12 layers) widths; roberta, --max-tokens 2048 at T = 512 (4 blocks), roberta_base (12 layers)
and roberta_large (24 layers) widths.

--packed: the ls_ models with --ls-packed True (ls_packed: the layers compute the batch's real tokens only)
against the same models with --ls-packed False (ls_padded), fairseq and fairseq_fused, on real batches:
Multi30k En-De's training text (--multi30k DIR, required: the folder holding train.en.gz and train.de.gz),
split into words and punctuation and binarized once by fairseq-preprocess into
--cache-dir (bench_support/multi30k.py). --family is not used; the cases are (--cases, default all;
bench_support/packed.py): translation = ls_transformer 3+3 layers, d 256, FFN 1024, 4 heads, a joined
dictionary of 10k tokens, one pool per --max-tokens (default 4096,16384); sentence = fairseq's
sentence_prediction task and criterion on the English sentences, 2 classes (longer than the median
sentence or not), roberta_base widths (d 768, FFN 3072, 12 heads) at 4 layers, --batch-size 32; lm = transformer_lm widths (d 512, FFN
2048, 8 heads) at 2 layers on the English side, --sample-break-mode eos (one sentence a row, right-padded),
the first --max-tokens; sweep = the translation model on synthetic batches of --sweep-batch B x T
positions (default 128x32), the sentences' lengths T (1 - b/B)^k so that each --sweep-pads share of the
positions (default 0, 0.1, ..., 0.6) is padding, ls_packed and ls_padded only. Every pool comes from
fairseq's own loader (task.get_batch_iterator, shuffled with seed 1; --pool batches, default --steps)
except the sweep's. Sides run in turns as in the throughput mode (default 1 thread, --warmup 2 steps per
pool on the pool's own batches, --steps 16 timed per side and pool in --rounds 2); then --ops-steps 2
steps under torch.profiler (each side's ops by self CPU time) and, per pool, bytes saved for backward
by one training forward on its first batch, ls_packed vs ls_padded (bench_support/saved_bytes.py).
Reported per pool: padding (padded positions / all positions of the source, the decoder input and both;
ideal = all positions / real positions), tokens/s per side (the task's ntokens: target tokens for
translation and the LM, input tokens for sentence_prediction), ls_packed's speed-up over each side
(summed times and the per-step ratio's median and IQR) beside the ideal and the target, median ms per
step (on the CPU the whole step is host time), saved bytes; for the sweep, the padding share at which
packed overtakes padded. --tiny runs every model at d=32, FFN 64, 2 heads (tests).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from scripts.bench_support import check_args, children

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout (scripts/ is its package)
HOST_TARGET, ACT_TARGET = 0.5, 0.6


def run_child(kind: str, spec: dict, a, threads=None) -> dict:
    """Runs `kind` (side | act) in a fresh process (bench_support/children.py: forked from a server with
    torch and fairseq imported on the CPU, a new interpreter on CUDA); returns its result."""
    return children.run("scripts.benchmark:child", dict(spec, kind=kind), a.repo, threads, fork=a.device == "cpu")


def child(spec: dict) -> dict:
    """A child's work (children.run): one side's timed run, or one forward's saved bytes."""
    if spec.pop("kind") == "side":
        from scripts.bench_support.timing import run_side
        return run_side(spec)
    from scripts.bench_support.saved_bytes import forward_saved_bytes
    return forward_saved_bytes(spec["args"], spec["pool"])


def quartiles(xs):
    """(q1, median, q3) of xs (statistics.quantiles, inclusive method)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def make_pools(a, data_bin: str, shapes, tmp: str, n_pool: int, layers, extra):
    """{label: (path, pool)}: one pool per (max_tokens, seq_len) shape from fairseq's loader (the
    fairseq side's arguments; batching depends only on the data and the shape)."""
    import torch

    from scripts.bench_support.corpus import draw_pool
    from scripts.bench_support.families import shape_label

    pools = {}
    for shape in shapes:
        args = train_args_for(a, data_bin, "fairseq", "fp32", shape, layers, extra)
        label = shape_label(*shape)
        path = os.path.join(tmp, f"pool{label.replace('@', '_')}.pt")
        pool = draw_pool(args, n_pool)
        torch.save(pool, path)
        pools[label] = (path, pool)
    return pools


def train_args_for(a, data_bin, side, precision, shape, layers, extra):
    """fairseq-train arguments of one side: `extra` for every side, --ls-extra for the ls side too."""
    from scripts.bench_support.sides import train_args
    if side == "ls":
        extra = list(extra) + a.ls_extra.split()
    return train_args(a.fam, data_bin, a.repo, side, a.arch_size, a.device, precision, shape, layers, extra)


def trainer_shape(shapes):
    """The shape a side's Trainer is built with: the pools hand it their batches, so only the longest
    block (the LM's --tokens-per-sample, hence its positions) matters."""
    lens = [t for _, t in shapes if t is not None]
    return shapes[0][0], max(lens) if lens else None


def data_bin_for(a, n: int, vocab: int) -> str:
    if a.data_bin:
        return a.data_bin
    t0 = time.perf_counter()
    d = a.fam.data_bin(a.cache_dir, n, vocab)
    print(f"data-bin: {d} ({n} synthetic {'lines' if a.fam.seq_len else 'pairs'}, {vocab}-entry dictionary; "
          f"{time.perf_counter() - t0:.0f} s incl. cache check)", flush=True)
    return d


def timed_rounds(a, sides, spec_for, rounds: int, threads):
    """Runs every side once per round, in turns; returns {side: [round results]}."""
    out = {s: [] for s in sides}
    for r in range(rounds):
        for side in sides:
            t0 = time.perf_counter()
            out[side].append(run_child("side", spec_for(side, r), a, threads))
            print(f"  round {r + 1}/{rounds} {side}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def step_split(steps: int, rounds: int):
    """Consecutive parts of range(steps), one per round."""
    cuts = [round(steps * r / rounds) for r in range(rounds + 1)]
    return [(cuts[r], cuts[r + 1]) for r in range(rounds)]


def summarize(sides, runs, pool, steps, key: str, flops_of=None, peak=None, ref: str = "ls") -> dict:
    """Per side, over the identical step list: tokens/s, median ms, MFU, and the speed-up of side `ref`
    over this one (ls_speedup_sum: the ratio of summed step times; ls_speedup_per_step: the per-step ratio's
    median and quartiles)."""
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
        for extra in ("memory", "syncs", "busy_fraction", "loss_scale", "ops", "saved_bytes"):
            vals = [r["pools"][key][extra] for r in runs[s] if extra in r["pools"][key]]
            if vals:
                row[extra] = vals[-1]
        if s != ref and ref in times:
            ratios = [b / l for b, l in zip(t, times[ref])]
            q1, q2, q3 = quartiles(ratios)
            row["ls_speedup_sum"] = sum(t) / sum(times[ref])  # = ref's tokens/s over this side's
            row["ls_speedup_per_step"] = {"median": q2, "q1": q1, "q3": q3}
        out[s] = row
    return {"step_tgt_tokens": tokens, "sides": out}


def fmt(x, spec, na="n/a"):
    return na if x is None else format(x, spec)


def throughput(a) -> dict:
    from scripts.bench_support.corpus import pad_fraction
    from scripts.bench_support.families import shape_label, shapes
    from scripts.bench_support.flops import batch_flops, device_peak_tflops

    cuda = a.device == "cuda"
    timed = shapes(a.fam, a.max_tokens, a.seq_len)
    labels = [shape_label(*sh) for sh in timed]
    mem_shapes = shapes(a.fam, a.memory_at, a.seq_len) if cuda else []
    memory_at = [shape_label(*sh) for sh in mem_shapes]
    extra_mem = [sh for sh in mem_shapes if sh not in timed]  # memory-only pools: a few untimed steps
    data_bin = data_bin_for(a, a.corpus_size, a.vocab)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_")
    extra = a.extra.split()
    pools = make_pools(a, data_bin, timed + extra_mem, tmp.name, a.pool, a.layers, extra)
    parts = step_split(a.steps, a.rounds)
    print(f"family {a.family}; device {a.device}; {a.arch_size} ({a.fam.archs[a.arch_size]}; "
          f"{'arch layers' if not a.layers else f'{a.layers} layers per stack'})"
          f"{'; extra: ' + a.extra if a.extra else ''}; sides {', '.join(a.sides)}; pool {a.pool} batches per "
          f"shape; warm-up {a.warmup} steps; {a.steps} timed steps per side in {a.rounds} rounds of "
          f"{', '.join(str(e - s) for s, e in parts)}; tok/s counts {a.fam.tokens}; repo {a.repo}", flush=True)
    results = {"mode": "throughput", "family": a.family, "tokens": a.fam.tokens, "device": a.device, "arch_size": a.arch_size,
               "layers": a.layers, "extra": a.extra, "ls_extra": a.ls_extra, "pool": a.pool, "warmup": a.warmup, "steps": a.steps,
               "rounds": a.rounds, "sides": a.sides, "data_bin": data_bin, "repo": a.repo, "precisions": {}}
    busy_at = "8192" if "8192" in labels else labels[0]
    for prec in a.precision:
        def spec_for(side, r, prec=prec):
            lo, hi = parts[r]
            last = r == a.rounds - 1
            pl = [{"label": lb, "path": pools[lb][0]} for lb in labels]
            if last:  # memory-only pools: 3 warm-up steps, none timed
                pl += [{"label": shape_label(*sh), "path": pools[shape_label(*sh)][0], "warmup": 3, "steps": 0}
                       for sh in extra_mem]
            return {"args": train_args_for(a, data_bin, side, prec, trainer_shape(timed + extra_mem), a.layers,
                                           extra),
                    "pools": pl, "warmup": a.warmup, "steps": hi - lo, "first_step": lo,
                    "memory_at": memory_at, "syncs": cuda and last and not a.no_syncs,
                    "busy_at": busy_at if cuda and last else None, "threads": a.threads,
                    "ops_steps": a.ops_steps if last else 0, "ops_top": a.ops_top}

        print(f"[{prec}]", flush=True)
        runs = timed_rounds(a, a.sides, spec_for, a.rounds, a.threads)
        first = runs[a.sides[0]][0]
        shape = first["model"]
        peak = device_peak_tflops(first["device"], prec, a.peak_tflops)
        rows = {}
        for lb in labels:
            pool = pools[lb][1]
            rows[lb] = {"pad_fraction": pad_fraction(pool, masked=a.fam.masked),
                        **summarize(a.sides, runs, pool, a.steps, lb, lambda b: batch_flops(b, shape), peak)}
        for sh in extra_mem:
            lb = shape_label(*sh)
            rows[lb] = {"memory_only": True, "sides": {
                s: {"memory": runs[s][-1]["pools"][lb].get("memory")} for s in a.sides}}
        results["precisions"][prec] = {"device_name": first["device"], "peak_tflops": peak,
                                       "num_params": first["num_params"], "model": shape,
                                       "threads": first["threads"], "shapes": rows}
        print_throughput(prec, results["precisions"][prec], a.sides)
        for lb in labels:
            print_ops(a, {s: runs[s][-1]["pools"][lb].get("ops") for s in a.sides})
    return results


def print_throughput(prec, res, sides):
    print(f"[{prec}] {res['device_name']}, {res['num_params'] / 1e6:.1f}M params, peak "
          f"{fmt(res['peak_tflops'], '.0f')} TFLOP/s, {res['threads']} threads", flush=True)
    print("torch optimizer classes: " + ", ".join(
        f"{s} {next(iter(res['shapes'].values()))['sides'][s].get('optimizer_class')}" for s in sides), flush=True)
    hdr = (f"{'tokens@T':>10} {'side':<14}{'tgt tok/s':>11}{'med ms':>9}{'TFLOP/s':>9}{'MFU':>7}"
           f"{'ls speedup':>11}{'per-step median [IQR]':>24}{'skip':>5}  per-round tok/s")
    print(hdr, flush=True)
    for mt, row in res["shapes"].items():
        if row.get("memory_only"):
            continue
        for s in sides:
            r = row["sides"][s]
            sp = r.get("ls_speedup_per_step")
            per_step = f"{sp['median']:.2f} [{sp['q1']:.2f}, {sp['q3']:.2f}]" if sp else ""
            print(f"{mt:>10} {s:<14}{r['tgt_tokens_per_s']:>11.0f}{r['median_ms']:>9.1f}"
                  f"{r['tflops_per_s']:>9.3f}{fmt(r['mfu'], '.1%'):>7}"
                  f"{fmt(r.get('ls_speedup_sum'), '.2f', ''):>10}{'x' if sp else ' '}{per_step:>24}"
                  f"{r['skipped']:>5}  {', '.join(f'{x:.0f}' for x in r['per_round_tokens_per_s'])}",
                  flush=True)
        pf = row["pad_fraction"]
        tgt = (f"masked {pf['masked']:.3f} of the real tokens" if pf["tgt"] is None else f"tgt {pf['tgt']:.3f}")
        print(f"{mt:>10} pad fraction: src {pf['src']:.3f}, {tgt}, all {pf['all']:.3f}", flush=True)
    for mt, row in res["shapes"].items():
        for s in sides:
            r = row["sides"][s]
            if r.get("memory"):
                m = r["memory"]
                print(f"{mt:>10} {s:<14} activation memory {m['activations'] / 2**20:.0f} MiB (peak in "
                      f"task.train_step {m['in_step'] / 2**20:.0f} MiB above the {m['static'] / 2**20:.0f} MiB "
                      f"allocated before forward; gradients {m['grad_bytes'] / 2**20:.0f} MiB "
                      f"{'already allocated' if m['grads_allocated_before'] else 'subtracted'})", flush=True)
            if r.get("syncs"):
                y = r["syncs"]
                print(f"{mt:>10} {s:<14} syncs per step: {y['train_step_total']} in Trainer.train_step, "
                      f"{y['model_criterion_fwd_bwd']} in forward+backward, {y['optimizer_step']} in the "
                      f"optimizer step", flush=True)
            if r.get("busy_fraction") is not None:
                print(f"{mt:>10} {s:<14} GPU busy {100 * r['busy_fraction']:.1f}% of a 5-step profiler trace",
                      flush=True)


def print_ops(a, ops: dict) -> None:
    """Prints each side's torch.profiler table ({side: op_breakdown's dict or None})."""
    for s, o in ops.items():
        if not o:
            continue
        for key, what in (("top", "self CPU time"), ("top_by_calls", "calls")):
            print(f"-- {s}: top entries by {what} (torch.profiler, {a.ops_steps} steps; per step; profiled "
                  f"self CPU {o['self_cpu_ms_per_step']:.1f} ms/step)", flush=True)
            for e in o[key]:
                print(f"   {e['name'][:60]:<60}{e['self_cpu_ms_per_step']:>9.2f} ms{e['calls_per_step']:>8.0f} calls",
                      flush=True)


def host_overhead(a) -> dict:
    if "ls" not in a.sides or len(a.sides) < 2:
        raise SystemExit(f"--host-overhead compares ls with a baseline: --sides must name ls and fairseq or "
                         f"fairseq_fused, got {','.join(a.sides)}")
    from scripts.bench_support.families import shape_label, shapes, tiny_width_args

    a.device = "cpu"
    data_bin = data_bin_for(a, a.host_pairs, a.host_vocab)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_host_")
    extra = tiny_width_args(a.fam) + a.extra.split()
    shape = shapes(a.fam, a.max_tokens[:1], a.seq_len[:1])[0]
    label = shape_label(*shape)
    pools = make_pools(a, data_bin, [shape], tmp.name, a.pool, None, extra)
    parts = step_split(a.steps, a.rounds)
    print(f"host overhead: family {a.family}, {a.fam.archs[a.arch_size]} depth, d=32, FFN 64, 2 heads, batches "
          f"{label} (max-tokens[@T]), fp32, 1 thread; pool {a.pool}; warm-up {a.warmup}; {a.steps} timed steps "
          f"per side in {a.rounds} rounds; repo {a.repo}", flush=True)

    def spec_for(side, r):
        lo, hi = parts[r]
        return {"args": train_args_for(a, data_bin, side, "fp32", shape, None, extra),
                "pools": [{"label": label, "path": pools[label][0]}], "warmup": a.warmup, "steps": hi - lo,
                "threads": 1, "first_step": lo, "ops_steps": a.ops_steps if r == a.rounds - 1 else 0,
                "ops_top": a.ops_top}

    runs = timed_rounds(a, a.sides, spec_for, a.rounds, 1)
    summary = summarize(a.sides, runs, pools[label][1], a.steps, label)
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
    print_ops(a, {s: rows[s].get("ops") for s in a.sides})
    return {"mode": "host_overhead", "family": a.family, "shape": label, "data_bin": data_bin, "repo": a.repo,
            "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "ls_over_base": ratio, "base": base,
            "target": HOST_TARGET, "tokens": a.fam.tokens, **summary}


def activation_bytes(a) -> dict:
    from scripts.bench_support.families import shape_label, shapes

    a.device = "cpu"
    data_bin = data_bin_for(a, a.corpus_size, a.vocab)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_act_")
    extra = a.extra.split()
    out = {"mode": "activation_bytes", "family": a.family, "data_bin": data_bin, "repo": a.repo,
           "ls_attention": a.ls_attention, "layers": a.layers, "sizes": {}}
    print(f"{'width':<11}{'tokens@T':>11} {'side':<10}{'saved MiB':>11}{'storages':>10}{'ctx-attr MiB':>14}"
          f"{'batch':>12}", flush=True)
    for size in a.act_sizes:
        a.arch_size = size
        out["sizes"][size] = {}
        for shape in shapes(a.fam, a.max_tokens, a.seq_len):
            label = shape_label(*shape)
            pool_path = make_pools(a, data_bin, [shape], tmp.name, 1, a.layers, extra)[label][0]
            row = {}
            for side in ("ls", "fairseq"):
                args = train_args_for(a, data_bin, side, "fp32", shape, a.layers, extra)
                if side == "ls" and a.ls_attention != "auto":  # ls's attention as on a GPU
                    args = [*args, "--ls-attention", a.ls_attention]
                row[side] = run_child("act", {"args": args, "pool": pool_path}, a, a.threads)
                r = row[side]
                print(f"{size:<11}{label:>11} {side:<10}{r['bytes'] / 2**20:>11.1f}{r['storages']:>10}"
                      f"{r['from_ctx_attributes'] / 2**20:>14.1f}{'x'.join(map(str, r['batch'])):>12}", flush=True)
            for side in ("ls", "fairseq"):
                print(f"      largest {side} groups: " + "; ".join(
                    f"{k} x{c}: {n / 2**20:.0f} MiB" for n, c, k in row[side]["largest"][:6]), flush=True)
            row["ratio"] = row["ls"]["bytes"] / row["fairseq"]["bytes"]
            print(f"{size:<11}{label:>11} ls / fairseq {row['ratio']:.2f}x (target <= {ACT_TARGET}x: "
                  f"{'met' if row['ratio'] <= ACT_TARGET else 'NOT met'}); {row['ls']['src_tokens']} source + "
                  f"{row['ls']['tgt_tokens']} {a.fam.tokens}", flush=True)
            out["sizes"][size][label] = row
    return out


def packed(a) -> dict:
    """--packed: every case of bench_support/packed.py, its sides in turns (the ls sides' last process
    also counts the saved bytes)."""
    import torch

    from scripts.bench_support import packed as pk
    from scripts.bench_support.corpus import draw_pool
    from scripts.bench_support.multi30k import data_bins

    t0 = time.perf_counter()
    bins = data_bins(a.multi30k, a.cache_dir)
    print(f"data-bins: {os.path.dirname(bins['lm'])} (Multi30k from {a.multi30k}; "
          f"{time.perf_counter() - t0:.0f} s incl. cache check)", flush=True)
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_packed_")
    parts = step_split(a.steps, a.rounds)
    B, T = a.sweep_batch
    print(f"packed: cases {', '.join(a.cases)}; device {a.device}; {a.threads} thread(s); "
          f"{'tiny widths; ' if a.tiny else ''}pool {a.pool} batches; warm-up {a.warmup} steps per pool; "
          f"{a.steps} timed steps per side and pool in {a.rounds} rounds; repo {a.repo}", flush=True)
    out = {"mode": "packed", "device": a.device, "threads": a.threads, "tiny": a.tiny, "extra": a.extra,
           "pool": a.pool, "warmup": a.warmup, "steps": a.steps, "rounds": a.rounds, "ops_steps": a.ops_steps,
           "sweep_batch": [B, T], "repo": a.repo, "cases": {}}
    for case in pk.cases(a, bins):
        sweep = case.name == "sweep"
        sides = pk.SWEEP_SIDES if sweep else pk.PACKED_SIDES
        pools = {}
        for label, shape in case.pools:
            pool = (pk.sweep_pool(case.data_bin, B, T, shape, a.pool) if sweep else
                    draw_pool(pk.side_args(a, case, "fairseq", shape), a.pool))
            pools[label] = (os.path.join(tmp.name, f"{label}.pt"), pool)
            torch.save(pool, pools[label][0])

        def spec_for(side, r, case=case, sweep=sweep):
            lo, hi = parts[r]
            last = r == a.rounds - 1
            return {"args": pk.side_args(a, case, side),
                    "pools": [{"label": lb, "path": pools[lb][0]} for lb, _ in case.pools],
                    "warmup": a.warmup, "steps": hi - lo, "first_step": lo, "threads": a.threads,
                    "ops_steps": a.ops_steps if last and not sweep else 0, "ops_top": pk.OPS_KEPT,
                    "saved_bytes": last and not sweep and side in ("ls_packed", "ls_padded")}

        print(f"[{case.name}] {case.layers} layers per stack; sides {', '.join(sides)}", flush=True)
        runs = timed_rounds(a, sides, spec_for, a.rounds, a.threads)
        row = {"layers": case.layers, "model": runs[sides[0]][0]["model"],
               "num_params": {s: runs[s][0]["num_params"] for s in sides},
               "args": {s: pk.side_args(a, case, s) for s in sides}, "pools": {}}
        for label, _ in case.pools:
            pool = pools[label][1]
            entry = {"padding": pk.padding(pool, target=case.family == "translation"),
                     "batches": [list(b["net_input"]["src_tokens"].shape) for b in pool],
                     **summarize(sides, runs, pool, a.steps, label, ref="ls_packed")}
            padded = entry["sides"]["ls_padded"]
            entry["packed_over_padded"] = {"sum": padded["ls_speedup_sum"], "per_step": padded["ls_speedup_per_step"],
                                           "ideal": entry["padding"]["ideal"], "target": pk.TARGETS.get(label)}
            if not sweep:
                saved = {s: entry["sides"][s].pop("saved_bytes") for s in ("ls_packed", "ls_padded")}
                entry["saved_bytes"] = {**saved, "packed_over_padded": saved["ls_packed"]["bytes"] /
                                        saved["ls_padded"]["bytes"]}
            row["pools"][label] = entry
        if sweep:
            row["break_even"] = pk.break_even([(e["padding"]["all"], e["packed_over_padded"]["sum"])
                                               for e in row["pools"].values()])
        out["cases"][case.name] = row
        print_packed_case(a, case.name, row, sides)
    print_packed_table(out)
    return out


def print_packed_case(a, name: str, row: dict, sides) -> None:
    """One case's per-side lines, then each pool's op table (torch.profiler, self CPU ms per step)."""
    from scripts.bench_support.packed import op_table

    print(f"{'pool':>17} {'side':<14}{'tok/s':>9}{'med ms':>9}{'packed speed-up [IQR]':>24}", flush=True)
    for label, e in row["pools"].items():
        for s in sides:
            r = e["sides"][s]
            sp = r.get("ls_speedup_per_step")
            per_step = (f"{r['ls_speedup_sum']:.2f}x {sp['median']:.2f} [{sp['q1']:.2f}, {sp['q3']:.2f}]"
                        if sp else "")
            print(f"{label:>17} {s:<14}{r['tgt_tokens_per_s']:>9.0f}{r['median_ms']:>9.1f}{per_step:>24}", flush=True)
        ops = {s: e["sides"][s].get("ops") for s in sides}
        if any(ops.values()):
            print(f"-- {label}: self CPU ms per step by op (torch.profiler, {a.ops_steps} steps; total "
                  + ", ".join(f"{s} {o['self_cpu_ms_per_step']:.0f}" for s, o in ops.items() if o) + ")", flush=True)
            print(f"   {'op':<52}" + "".join(f"{s:>14}" for s in sides), flush=True)
            for n, v in op_table(ops, sides, a.ops_top):
                print(f"   {n[:52]:<52}" + "".join(f"{fmt(v[s], '.1f', '-'):>14}" for s in sides), flush=True)


def print_packed_table(res: dict) -> None:
    """The summary: per pool, padding, tokens/s of each side, packed / padded against its ideal and
    target, median ms per step (on the CPU, all of it host time), saved bytes packed vs padded."""
    from scripts.bench_support.packed import PACKED_SIDES

    print(f"{'pool':>17}{'pad src':>8}{'tgt':>6}{'all':>6}  " + "".join(f"{s + ' tok/s':>20}" for s in PACKED_SIDES)
          + f"{'packed/padded [IQR]':>24}{'ideal':>7}{'target':>8}{'ms packed':>10}{'padded':>8}"
          f"{'saved MiB packed':>17}{'padded':>8}{'ratio':>7}", flush=True)
    for name, row in res["cases"].items():
        for label, e in row["pools"].items():
            p, q = e["padding"], e["packed_over_padded"]
            sp = q["per_step"]
            tgt = q["target"]
            met = "" if tgt is None else f"{tgt:.2f}{'+' if q['sum'] >= tgt else '-'}"
            toks = "".join(f"{fmt(e['sides'][s]['tgt_tokens_per_s'] if s in e['sides'] else None, '.0f', '-'):>20}"
                           for s in PACKED_SIDES)
            sb = e.get("saved_bytes")
            saved = (f"{sb['ls_packed']['bytes'] / 2**20:>17.1f}{sb['ls_padded']['bytes'] / 2**20:>8.1f}"
                     f"{sb['packed_over_padded']:>7.2f}" if sb else "")
            print(f"{label:>17}{p['src']:>8.3f}{fmt(p['tgt'], '.3f', '-'):>6}{p['all']:>6.3f}  {toks}"
                  f"{q['sum']:>8.2f}x {sp['median']:.2f} [{sp['q1']:.2f}, {sp['q3']:.2f}]{q['ideal']:>7.2f}{met:>8}"
                  f"{e['sides']['ls_packed']['median_ms']:>10.0f}{e['sides']['ls_padded']['median_ms']:>8.0f}{saved}",
                  flush=True)
        if "break_even" in row:
            print(f"sweep ({'x'.join(map(str, res['sweep_batch']))} batches): {row['break_even']['note']}", flush=True)
    print("target column: the packed/padded target, + met, - not met", flush=True)


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


def finish(res: dict, t0: float, load_before, argv, json_path, more_paths=()) -> None:
    """Adds the wall time, the machine and argv to res, prints the closing line, writes res to json_path
    with the measured tree's commit and without the machine's paths (bench_support/provenance.py;
    more_paths: further (directory, placeholder) pairs to scrub)."""
    from scripts.bench_support.provenance import record

    res["wall_s"] = time.perf_counter() - t0
    res["machine"] = machine(load_before)
    res["argv"] = sys.argv[1:] if argv is None else list(argv)
    m = res["machine"]
    print(f"done in {res['wall_s']:.0f} s; {m['nproc']} x {m['cpu']}; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.1f}' for x in m['loadavg_before'])}, after "
          f"{', '.join(f'{x:.1f}' for x in m['loadavg_after'])}", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(record(res, res.get("repo") or ROOT, more_paths), f, indent=1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    strs = lambda s: s.split(",")  # noqa: E731
    from scripts.bench_support.families import FAMILIES

    p.add_argument("--family", choices=list(FAMILIES), default="translation",
                   help="the model family (bench_support/families.py; default: %(default)s)")
    p.add_argument("--host-overhead", action="store_true", help="the host-time mode (see below)")
    p.add_argument("--activation-bytes", action="store_true", help="the saved-bytes mode (see below)")
    p.add_argument("--packed", action="store_true", help="the packed-rows mode on Multi30k (see below)")
    p.add_argument("--multi30k", help="--packed (required): the Multi30k En-De folder (train.en.gz, train.de.gz)")
    p.add_argument("--cases", type=strs, help="--packed: comma list of translation,sentence,lm,sweep (default: all)")
    p.add_argument("--tiny", action="store_true", help="--packed: every model at d=32, FFN 64, 2 heads (for tests)")
    p.add_argument("--sweep-batch", default="128x32", help="--packed sweep: B x T of the synthetic batches "
                   "(default: %(default)s)")
    p.add_argument("--sweep-pads", type=lambda s: [float(x) for x in s.split(",")],
                   default=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                   help="--packed sweep: padding shares of the B x T positions (default: 0,0.1,...,0.6)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    p.add_argument("--data-bin", help="any fairseq data-bin of the family's task (translation: a joined "
                   "dictionary; lm, roberta: one dict.txt, without <mask>) (default: the family's synthetic corpus)")
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "fls_bench_cache"),
                   help="where the synthetic corpus is made once and reused (default: %(default)s)")
    p.add_argument("--corpus-size", "--corpus-pairs", type=int, dest="corpus_size",
                   help="synthetic corpus size: sentence pairs (translation, default 1M) or lines (lm, roberta: default 200k)")
    p.add_argument("--vocab", type=int, help="synthetic dictionary size incl. specials (default: 32000 "
                   "translation, 50264 lm and roberta)")
    p.add_argument("--arch-size", choices=sorted({k for f in FAMILIES.values() for k in f.archs}),
                   help="translation: base | big (default: base on CPU, big on CUDA); lm: base (transformer_lm) | "
                        "gpt2_small (transformer_lm_gpt: d 768, 12 layers) (default: base on CPU, gpt2_small on CUDA); "
                        "roberta: base (roberta_base) | large (roberta_large) (default: base)")
    p.add_argument("--layers", type=int, help="layers per stack (default on CPU: 2+2 translation, 4 lm and roberta; the "
                   "arch's on CUDA and for --host-overhead / --activation-bytes)")
    p.add_argument("--precision", type=strs, help="comma list of fp32,fp16,bf16 (default: fp32 on CPU; fp16 "
                   "translation, bf16 lm and roberta on CUDA)")
    p.add_argument("--max-tokens", type=ints, help="comma list (translation: 1024 on CPU, 8192 on CUDA, "
                   "--host-overhead 512, --activation-bytes 4096; lm: 1024 on CPU, 16384 on CUDA, "
                   "--host-overhead 512, --activation-bytes 2048; roberta: as lm)")
    p.add_argument("--seq-len", type=ints, help="lm, roberta: comma list of block lengths T (--tokens-per-sample), each "
                   "timed at every --max-tokens (default lm: 512 on CPU, 1024,4096 on CUDA, --host-overhead 128, "
                   "--activation-bytes 512,2048; roberta: 512, --host-overhead 128)")
    p.add_argument("--sweep", action="store_true", help="CUDA: --max-tokens 4096,8192,16384,32768 "
                   "(lm, roberta: 8192,16384,32768)")
    p.add_argument("--pool", type=int, help="batches per pool (default: 100; --packed: --steps)")
    p.add_argument("--warmup", type=int, help="untimed steps over the pool per process (default: 50 on CUDA, "
                   "5 on CPU, 20 for --host-overhead)")
    p.add_argument("--steps", type=int, help="timed steps per side (default: 100; --host-overhead 150)")
    p.add_argument("--rounds", type=int, help="turns per side, the timed steps split among them "
                   "(default: 2 on CUDA, 4 on CPU, 3 for --host-overhead)")
    p.add_argument("--sides", type=strs, help="comma list of ls,fairseq,fairseq_fused (default: all three; "
                   "--host-overhead: ls,fairseq)")
    p.add_argument("--memory-at", type=ints, help="CUDA: max-tokens at which to measure activation memory "
                   "(lm, roberta: at every --seq-len) (default: 8192,32768 translation, 16384 lm and roberta)")
    p.add_argument("--no-syncs", action="store_true", help="CUDA: skip counting host-device syncs")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU when not in the table (or on CPU)")
    p.add_argument("--threads", type=int, help="torch threads in the children (default: torch's)")
    p.add_argument("--extra", default="", help="more fairseq-train arguments for every side, quoted")
    p.add_argument("--ls-extra", default="", help="more fairseq-train arguments for the ls side only, quoted "
                   "(e.g. \"--ls-recompute-attention True\")")
    p.add_argument("--host-pairs", type=int, default=20000, help="--host-overhead corpus pairs")
    p.add_argument("--host-vocab", type=int, default=1000, help="--host-overhead dictionary size")
    p.add_argument("--ops-steps", type=int, help="steps profiled with torch.profiler after the timed ones, in "
                   "the last round (default: 20 for --host-overhead, 0 = none for throughput)")
    p.add_argument("--ops-top", type=int, default=15, help="--ops-steps: ops listed per side")
    p.add_argument("--act-sizes", type=strs, help="--activation-bytes widths (default: base,big translation, "
                   "base,gpt2_small lm, base,large roberta)")
    p.add_argument("--ls-attention", choices=["auto", "sdpa"], default="auto",
                   help="--activation-bytes: ls attention path; sdpa = the GPU's (torch's fused attention, "
                        "as fairseq's side runs it on the CPU too), auto = the device's (explicit on CPU)")
    p.add_argument("--json", help="write the results here")
    children.add_args(p)
    a = children.parse(p, argv)
    if a._child:
        return a
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.packed:
        return packed_args(p, a)
    cpu = a.device == "cpu"
    host = a.host_overhead
    a.pool = a.pool or 100
    a.fam = fam = FAMILIES[a.family]
    d = fam.defaults["host" if host else "act" if a.activation_bytes else a.device]
    if a.arch_size is None or host:  # --host-overhead: always the family's deep arch, at the tiny width
        a.arch_size = d["arch_size"] if "arch_size" in d else next(iter(fam.archs))
    if a.arch_size not in fam.archs:
        p.error(f"--arch-size {a.arch_size}: family {a.family} has {', '.join(fam.archs)}")
    a.act_sizes = a.act_sizes or fam.defaults["act"]["sizes"]
    if a.activation_bytes and any(x not in fam.archs for x in a.act_sizes):
        p.error(f"--act-sizes {','.join(a.act_sizes)}: family {a.family} has {', '.join(fam.archs)}")
    if a.layers is None and not host:
        a.layers = d["layers"]
    if a.seq_len and not fam.seq_len:
        p.error(f"--seq-len: family {a.family} batches sentences by --max-tokens only")
    a.seq_len = a.seq_len or d.get("seq_len", [None])
    a.corpus_size = a.corpus_size or fam.defaults["corpus"]
    a.vocab = a.vocab or fam.defaults["vocab"]
    a.precision = a.precision or fam.defaults[a.device]["precision"]
    a.max_tokens = fam.defaults["cuda"]["sweep"] if a.sweep else a.max_tokens or d["max_tokens"]
    a.memory_at = a.memory_at or fam.defaults["cuda"]["memory_at"]
    a.warmup = a.warmup if a.warmup is not None else (20 if host else 5 if cpu else 50)
    a.steps = a.steps or (150 if host else 100)
    a.ops_steps = a.ops_steps if a.ops_steps is not None else (20 if host else 0)
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


def packed_args(p, a):
    """--packed's defaults and checks."""
    from scripts.bench_support.multi30k import check_dir
    from scripts.bench_support.packed import CASES

    if not a.multi30k:
        p.error("--packed needs --multi30k DIR: the Multi30k En-De training text (train.en.gz, train.de.gz)")
    a.multi30k = os.path.abspath(a.multi30k)
    try:
        check_dir(a.multi30k)
    except ValueError as e:
        p.error(str(e))
    a.cases = a.cases or list(CASES)
    if [c for c in a.cases if c not in CASES]:
        p.error(f"--cases {','.join(a.cases)}: a comma list of {','.join(CASES)}")
    try:
        a.sweep_batch = [int(x) for x in a.sweep_batch.lower().split("x")]
        assert len(a.sweep_batch) == 2 and min(a.sweep_batch) >= 2
    except (ValueError, AssertionError):
        p.error(f"--sweep-batch {a.sweep_batch}: B x T, two integers >= 2 (e.g. 128x32)")
    if [x for x in a.sweep_pads if not 0 <= x <= 0.9]:
        p.error(f"--sweep-pads {','.join(map(str, a.sweep_pads))}: shares in [0, 0.9]")
    if a.device == "cuda" and not a.check_args:
        import torch
        if not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device")
    a.max_tokens = a.max_tokens or [4096, 16384]
    a.threads = a.threads or 1
    a.steps = a.steps or 16
    a.warmup = a.warmup if a.warmup is not None else 2
    a.rounds = a.rounds or 2
    a.pool = a.pool or a.steps
    a.ops_steps = a.ops_steps if a.ops_steps is not None else 2
    for name, val, lo in (("--pool", a.pool, 1), ("--steps", a.steps, 1), ("--rounds", a.rounds, 1),
                          ("--warmup", a.warmup, 0), ("--layers", a.layers or 1, 1)):
        if val < lo:
            p.error(f"{name} {val}: must be >= {lo}")
    if a.rounds > a.steps:
        p.error(f"--rounds {a.rounds}: at most --steps ({a.steps}), each round times at least one step")
    return a


def main(argv=None):
    a = parse_args(argv)
    if a._child:
        children.serve(child, a._child)
        return
    check_args.finish(a, "benchmark.py")
    children.use_tree(a.repo)
    import logging
    import warnings
    logging.disable(logging.WARNING)  # fairseq's INFO lines
    warnings.filterwarnings("ignore")  # hydra's deprecation notes on every config
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    res = (packed(a) if a.packed else host_overhead(a) if a.host_overhead else
           activation_bytes(a) if a.activation_bytes else throughput(a))
    finish(res, t0, load_before, argv, a.json, [(a.multi30k, "<multi30k>")] if a.packed else ())

if __name__ == "__main__":
    main()
