"""The child process of one benchmark side: builds fairseq's Trainer once, then for each batch pool
warms up and times fairseq's real training step, `trainer.train_step([sample])` (what fairseq-train
runs per update: sample to device and dtype, task.train_step = forward, loss and backward, fp16/bf16
loss scaling and overflow check, gradient all-reduce (a no-op on one device), clipping, optimizer
step, lr update, logging aggregation). Nothing else is inside a timed step.

Timing: CPU, time.perf_counter around each step; CUDA, a pair of CUDA events around each step (read
after the last step). Untimed extras after the timed steps, each on a pool batch:
- memory (CUDA): one step with task.train_step wrapped: static = memory_allocated() just before the
  forward, peak = max_memory_allocated() after the backward (reset just before the forward);
- syncs (CUDA): one step under torch.cuda.set_sync_debug_mode("warn"), counting the warnings inside
  task.train_step (model + criterion forward and backward), inside the torch optimizer's step, and
  in the whole Trainer.train_step (fairseq's own logging and overflow checks included);
- busy (CUDA): a torch.profiler trace of a few steps: the union of kernel/memcpy/memset intervals
  over the window from the first step's start to the last kernel's end;
- ops (any device): a torch.profiler CPU trace of a few steps, the top ops by self CPU time with
  their calls per step (for --host-overhead);
- saved bytes (any device): the bytes one training forward on the pool's first batch saves for backward,
  in a model built afresh from the same arguments (saved_bytes.forward_saved_bytes).
"""
import json
import os
import tempfile
import time
import warnings


def _inner_optimizer(trainer):
    """The torch.optim.Optimizer that trainer.optimizer drives (fp16/bf16 wrappers expose it too)."""
    return trainer.optimizer.optimizer


def _busy_fraction(trace_path: str) -> float:
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == "bench_step"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    if not steps or not kernels:
        return float("nan")
    start = min(e["ts"] for e in steps)
    end = max(max(e["ts"] + e["dur"] for e in steps), kernels[-1][1])
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in kernels:
        s, e = max(s, start), min(e, end)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / (end - start)


def op_breakdown(prof, steps: int, top: int) -> dict:
    """The `top` entries by self CPU time and the `top` by calls (name, calls per step, self CPU ms per
    step), op calls per step (every profiler entry but the autograd engine's per-node wrappers), and
    backward nodes per step (the engine's evaluate_function entries). Entries include fairseq's
    record_function scopes ("forward", "backward", "clip-grads", ...), whose self time is the Python
    time inside them not spent in any op."""
    avgs = list(prof.key_averages())
    bwd = sum(a.count for a in avgs if a.key.startswith("autograd::engine::evaluate_function"))
    calls = sum(a.count for a in avgs if not a.key.startswith("autograd::engine"))

    def rows(key):
        return [{"name": a.key, "calls_per_step": a.count / steps,
                 "self_cpu_ms_per_step": a.self_cpu_time_total / 1e3 / steps}
                for a in sorted(avgs, key=key, reverse=True)[:top]]

    return {"top": rows(lambda a: a.self_cpu_time_total), "top_by_calls": rows(lambda a: a.count),
            "self_cpu_ms_per_step": sum(a.self_cpu_time_total for a in avgs) / 1e3 / steps,
            "op_calls_per_step": calls / steps, "backward_nodes_per_step": bwd / steps}


def run_side(spec: dict) -> dict:
    """spec: args (fairseq-train arguments), pools ([{"label", "path"}], with "warmup" and "steps" to
    override the counts, e.g. a memory-only pool), warmup, steps, first_step
    (timed step k trains on pool batch (first_step + k) mod pool size), and the
    extras: memory_at (pool labels), syncs (bool), busy_at (a pool label or None), busy_steps,
    ops_steps (0: none), ops_top, saved_bytes (bool), threads. Returns per pool label: times (s per timed
    step), skipped (updates fairseq skipped, e.g. fp16 overflow, over warm-up + timed), and the extras'
    results."""
    import torch

    from scripts.bench_support.flops import model_shape
    from scripts.bench_support.fused_adamw import register
    from scripts.bench_support.saved_bytes import forward_saved_bytes
    from scripts.bench_support.sides import build_trainer

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    register()
    cfg, task, trainer = build_trainer(spec["args"])
    cuda = torch.cuda.is_available() and not cfg.common.cpu
    dev_sync = torch.cuda.synchronize if cuda else (lambda: None)
    _inner_optimizer(trainer)  # built now (lazily built otherwise), outside every measurement

    def step(sample) -> bool:
        """One update; True if fairseq skipped it (overflow, OOM retry)."""
        n0 = trainer.get_num_updates()
        trainer.train_step([sample])
        return trainer.get_num_updates() == n0

    out = {"model": model_shape(trainer.model), "num_params": sum(p.numel() for p in trainer.model.parameters()),
           "device": torch.cuda.get_device_name() if cuda else "cpu", "threads": torch.get_num_threads(),
           "optimizer": type(_inner_optimizer(trainer)).__name__, "pools": {}}
    first = spec.get("first_step", 0)  # this round's part of the timed step list
    for entry in spec["pools"]:
        label = entry["label"]
        warmup, steps = entry.get("warmup", spec["warmup"]), entry.get("steps", spec["steps"])
        pool = torch.load(entry["path"], weights_only=False)
        n = len(pool)
        skipped = sum(step(pool[i % n]) for i in range(warmup))
        # what the timed steps trained on, so a caller can check every side saw the same batches
        checksum = sum(int(pool[(first + k) % n]["target"].sum()) for k in range(steps))
        dev_sync()
        times = []
        if cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(steps)]
            for k in range(steps):
                ev[k][0].record()
                skipped += step(pool[(first + k) % n])
                ev[k][1].record()
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) / 1e3 for a, b in ev]
        else:
            for k in range(steps):
                t0 = time.perf_counter()
                skipped += step(pool[(first + k) % n])
                times.append(time.perf_counter() - t0)
        scaler = getattr(trainer.optimizer, "scaler", None)  # fp16's dynamic loss scaler
        res = {"times": times, "skipped": skipped, "target_checksum": checksum,
               "loss_scale": None if scaler is None else float(scaler.loss_scale)}
        if cuda and label in spec.get("memory_at", ()):
            res["memory"] = _memory_step(trainer, task, step, pool[0])
        if cuda and spec.get("syncs") and steps:
            res["syncs"] = _sync_step(trainer, task, step, pool[1 % n])
        if cuda and spec.get("busy_at") == label:
            res["busy_fraction"] = _busy_steps(step, pool, spec.get("busy_steps", 5))
        if spec.get("ops_steps"):
            res["ops"] = _ops_steps(step, pool, spec["ops_steps"], spec.get("ops_top", 15))
        if spec.get("saved_bytes"):
            res["saved_bytes"] = forward_saved_bytes(spec["args"], entry["path"])
        out["pools"][label] = res
    return out


def _memory_step(trainer, task, step, sample) -> dict:
    import torch

    rec = {}
    orig = task.train_step
    params = list(trainer.model.parameters())

    def wrapped(*a, **k):
        torch.cuda.synchronize()
        rec["grads_allocated_before"] = any(p.grad is not None for p in params)
        rec["static"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        r = orig(*a, **k)
        torch.cuda.synchronize()
        rec["peak"] = torch.cuda.max_memory_allocated()
        return r

    task.train_step = wrapped
    try:
        step(sample)
    finally:
        task.train_step = orig
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    rec["in_step"] = rec["peak"] - rec["static"]
    rec["grad_bytes"] = grad_bytes
    # gradients made during backward are in the peak when they were freed before (fairseq's zero_grad)
    rec["activations"] = rec["in_step"] - (0 if rec["grads_allocated_before"] else grad_bytes)
    return rec


def _sync_step(trainer, task, step, sample) -> dict:
    import torch

    marks = {}
    caught = []
    orig = task.train_step

    def wrapped(*a, **k):
        marks["fwd_bwd0"] = len(caught)
        r = orig(*a, **k)
        marks["fwd_bwd1"] = len(caught)
        return r

    opt = _inner_optimizer(trainer)
    h0 = opt.register_step_pre_hook(lambda *a: marks.__setitem__("opt0", len(caught)))
    h1 = opt.register_step_post_hook(lambda *a: marks.__setitem__("opt1", len(caught)))
    task.train_step = wrapped
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            caught = w
            torch.cuda.set_sync_debug_mode("warn")
            step(sample)
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        task.train_step = orig
        h0.remove()
        h1.remove()
    syncs = [i for i, x in enumerate(caught) if "synchroniz" in str(x.message)]

    def between(a, b):
        return sum(marks.get(a, 0) <= i < marks.get(b, 0) for i in syncs)

    return {"train_step_total": len(syncs), "model_criterion_fwd_bwd": between("fwd_bwd0", "fwd_bwd1"),
            "optimizer_step": between("opt0", "opt1"),
            "first_messages": sorted({str(caught[i].message)[:160] for i in syncs})[:5]}


def _busy_steps(step, pool, n: int) -> float:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            with record_function("bench_step"):
                step(pool[i % len(pool)])
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        return _busy_fraction(path)


def _ops_steps(step, pool, n: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):  # the profiler's one-off start-up costs (~0.2 s
        step(pool[0])  # seen inside the first profiled step) stay out of the breakdown
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(n):
            step(pool[i % len(pool)])
    return op_breakdown(prof, n, top)
