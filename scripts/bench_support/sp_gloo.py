"""`scripts/bench_sequence_parallel.py --gloo`: a real sequence-parallel run, 2 processes over gloo on
this machine's CPU, against the same model unsharded in one process.

Each timed step is what a training step of one SP group does to one shared batch: forward and
backward through the criterion, then the all-reduce of the partial gradients over the 2 ranks (one
flat buffer, as fairseq's legacy_ddp does; P = 1 has none). Tokens/s = B * T target tokens per step /
the median step time (rank 0's; the collectives keep the ranks in step).
"""
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scripts.bench_support.sp_cells import build, decoder_only, sample, stacks


def _steps(model, criterion, smp, warmup: int, steps: int, all_reduce: bool) -> list:
    times = []
    for k in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss, _, _ = criterion(model, smp)
        loss.backward()
        if all_reduce:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            o = 0
            for g in grads:  # back into the gradients, as DDP does
                g.copy_(flat[o:o + g.numel()].view_as(g))
                o += g.numel()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def _worker(rank: int, port: int, cfg: dict, mode: str, B: int, T: int, warmup: int, steps: int, threads: int,
            queue) -> None:
    from fairseq_lightseq.sequence_parallel.sharding import SequenceParallel

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        task, model, criterion = build(cfg, T + 8)
        for m in stacks(model):
            m.sequence_parallel = SequenceParallel(dist.group.WORLD, 2, rank, mode)
        times = _steps(model, criterion, sample(task, B, T, "cpu", decoder_only=decoder_only(model)),
                       warmup, steps, True)
        if rank == 0:
            queue.put(times)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cfg: dict, mode: str, B: int, T: int, warmup: int, steps: int, threads: int, log=print) -> dict:
    """P = 2 over gloo (2 processes, `threads` each) and P = 1 in this process (2 x threads), the same
    model, batch and step count. Returns both medians, tokens/s and the ratio P2 / P1."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    log(f"gloo: P=2 ({mode}), 2 processes x {threads} thread(s), B={B} T={T}, {warmup} warm-up + {steps} steps")
    procs = [ctx.Process(target=_worker, args=(r, port, cfg, mode, B, T, warmup, steps, threads, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"gloo workers exited with {[p.exitcode for p in procs]}")
    t2 = queue.get()
    log(f"gloo: P=1, 1 process x {2 * threads} thread(s)")
    torch.set_num_threads(2 * threads)
    task, model, criterion = build(cfg, T + 8)
    t1 = _steps(model, criterion, sample(task, B, T, "cpu", decoder_only=decoder_only(model)), warmup, steps, False)
    m1, m2 = statistics.median(t1), statistics.median(t2)
    res = {"mode": mode, "B": B, "T": T, "warmup": warmup, "steps": steps, "threads_per_rank": threads,
           "p1_step_seconds": t1, "p2_step_seconds": t2, "p1_tokens_per_s": B * T / m1, "p2_tokens_per_s": B * T / m2,
           "ratio_p2_over_p1": m1 / m2}
    log(f"gloo: P=1 {res['p1_tokens_per_s']:.0f} tok/s, P=2 {res['p2_tokens_per_s']:.0f} tok/s, "
        f"ratio {res['ratio_p2_over_p1']:.2f}")
    return res
