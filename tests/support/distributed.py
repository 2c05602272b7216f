"""Run a test function in W CPU processes over gloo (torch.multiprocessing spawn, file rendezvous).

fn(rank, world, *args) runs in every process with torch.distributed initialised; an exception in any
rank fails the calling test with that rank's traceback."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, world, init_file, fn, args):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `support`
    torch.set_num_threads(1)  # W processes share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args) -> None:
    """fn(rank, world, *args) in `world` gloo processes; raises if any of them raises."""
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, os.path.join(d, "rendezvous"), fn, args), nprocs=world, join=True)
