"""Training throughput and peak memory: `ls_transformer_<arch>` against fairseq's `transformer_<arch>`.

Both models get identical command-line arguments and train on the SAME batches: one list of samples
is drawn from fairseq's own data loader (task.get_batch_iterator over a data-bin, shuffled with a
fixed seed), saved, and fed to fairseq's `Trainer.train_step` for each model; warm-up steps are not
timed, then `--repeats` timed runs of `--steps` steps each (the median is reported).

    python scripts/benchmark.py                   # CPU: Transformer-base with --layers 2, fp32 (< 3 min)
    python scripts/benchmark.py --device cuda     # CUDA: Transformer-big, fp16 and bf16, 8192 tokens
    python scripts/benchmark.py --data-bin DIR --arch-size big --device cuda --fp16 --max-tokens 4096

Without --data-bin a synthetic one is made with fairseq-preprocess (joined dictionary) from random
sentences of word ids with Zipf-like frequencies and log-normal lengths (mean about 27 tokens).
Throughput: wps = target tokens per second (fairseq's wps), and the source+target token rate.
Peak memory: each (model, precision) runs in a fresh subprocess. CUDA: torch.cuda.max_memory_allocated
over the whole run (weights, fp32 master copies, optimizer state, activations). CPU: growth of the
peak resident set size (getrusage ru_maxrss) from just before the model is built: an upper bound
that includes allocator slack.
`--bf16` uses fairseq's Trainer bf16 path (model and batches in bfloat16, FP16Optimizer with fp32
master weights); fairseq's command line maps --bf16 to TPU, so the config's `tpu` is reset here.
"""
import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "fairseq_lightseq")
sys.path.insert(0, ROOT)

ARCHS = {"base": "transformer_wmt_en_de", "big": "transformer_vaswani_wmt_en_de_big"}


# ----------------------------------------------------------------------------------------- data
def write_synthetic_corpus(d: str, n_sentences: int, vocab: int, seed: int = 0) -> None:
    """train.src/train.tgt (and a tiny valid) of random words: Zipf-like word frequencies, log-normal
    sentence lengths clipped to [1, 200] (mean about 27, as in WMT'14 en-de after BPE)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (i + 10) for i in range(vocab)]
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    for split, n in (("train", n_sentences), ("valid", 8)):
        with open(os.path.join(d, f"{split}.src"), "w") as fs, open(os.path.join(d, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                src_len = rng.lognormvariate(math.log(24), 0.5)
                tgt_len = src_len * rng.lognormvariate(0.0, 0.1)  # a translation's length follows its source's
                for f, length in ((fs, src_len), (ft, tgt_len)):
                    length = min(200, max(1, int(length)))
                    f.write(" ".join(rng.choices(words, cum_weights=cum, k=length)) + "\n")


def make_data_bin(d: str, n_sentences: int, vocab: int) -> str:
    """A synthetic data-bin under d (fairseq-preprocess, joined dictionary); returns its path."""
    write_synthetic_corpus(d, n_sentences, vocab)
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
           "--trainpref", os.path.join(d, "train"), "--validpref", os.path.join(d, "valid"),
           "--destdir", os.path.join(d, "bin"), "--joined-dictionary", "--workers", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"fairseq-preprocess failed:\n{r.stderr[-3000:]}")
    return os.path.join(d, "bin")


# -------------------------------------------------------------------------------------- trainer
def train_args(data_bin: str, arch: str, device: str, precision: str, max_tokens: int, layers=None,
               ls_stack: bool = False, extra=()):
    """fairseq-train arguments. Identical for both models except the arch (and with ls_stack the
    criterion/optimizer of the ls side)."""
    ls = arch.startswith("ls_")
    args = [data_bin, "--user-dir", USER_DIR, "--arch", arch, "--share-all-embeddings",
            "--optimizer", "ls_adam" if (ls and ls_stack) else "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
            "--criterion", "ls_label_smoothed_cross_entropy" if (ls and ls_stack) else "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--max-tokens", str(max_tokens), "--seed", "1", "--num-workers", "0",
            "--log-format", "none", *extra]
    if layers:
        args += ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    if device == "cpu":
        args.append("--cpu")
    if precision == "fp16":
        args.append("--fp16")
    elif precision == "bf16":
        args.append("--bf16")
    return args


def build_trainer(args_list):
    """(cfg, task, trainer) from fairseq-train arguments, as fairseq_cli.train builds them (the
    train split loaded). --bf16 runs on the CPU/CUDA device, not TPU (see the module docstring)."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=args_list)
    args.tpu = False  # fairseq maps --bf16 to --tpu; we want bf16 on this device
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, Trainer(cfg, task, model, criterion)


def draw_samples(args_list, n: int):
    """The first n training batches of fairseq's own loader (shuffled with --seed), on the CPU."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=args_list)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset), max_tokens=cfg.dataset.max_tokens,
        max_positions=(cfg.task.max_source_positions, cfg.task.max_target_positions),
        ignore_invalid_inputs=True, required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, num_workers=0, epoch=1).next_epoch_itr(shuffle=True)
    samples = []
    for s in itr:
        samples.append(s)
        if len(samples) == n:
            break
    if len(samples) < n:  # a small data-bin: cycle over its batches
        samples = [samples[i % len(samples)] for i in range(n)]
    return samples


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(args_list, samples_path: str, warmup: int, steps: int, repeats: int) -> dict:
    """Trains one model on the saved samples (in this process); returns timings and peak memory."""
    import torch

    import fairseq.trainer  # noqa: F401  (imports outside the measurement)

    samples = torch.load(samples_path, weights_only=False)
    cuda = "--cpu" not in args_list
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rss0 = _rss_bytes()
    cfg, task, trainer = build_trainer(args_list)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    i = 0

    last = {}

    def step():
        nonlocal i, last
        last = trainer.train_step([samples[i % len(samples)]]) or {}
        i += 1

    for _ in range(warmup):
        step()
    times, tgt_tokens, all_tokens = [], 0, 0
    for _ in range(repeats):
        batch_ids = [(i + k) % len(samples) for k in range(steps)]
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        times.append(time.perf_counter() - t0)
        tgt_tokens = sum(samples[b]["ntokens"] for b in batch_ids)
        all_tokens = tgt_tokens + sum(int(samples[b]["net_input"]["src_lengths"].sum()) for b in batch_ids)
    t = statistics.median(times)
    out = {"sec_per_step": t / steps, "wps": tgt_tokens / t, "tokens_per_s": all_tokens / t,
           "times": times, "last_loss": float(last["loss"]) if "loss" in last else None}
    if cuda:
        out["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["peak_kind"] = "torch.cuda.max_memory_allocated"
    else:
        out["peak_mb"] = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0) / 2**20
        out["peak_kind"] = "ru_maxrss growth from before the model was built"
    out["num_params"] = sum(p.numel() for p in trainer.model.parameters())
    return out


def run_child(args_list, samples_path, warmup, steps, repeats, threads):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    spec = json.dumps({"args": args_list, "samples": samples_path, "warmup": warmup, "steps": steps,
                       "repeats": repeats})
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", spec], capture_output=True,
                       text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"benchmark case failed ({' '.join(args_list)}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def main(argv=None):
    import logging
    logging.disable(logging.WARNING)  # fairseq's INFO lines (children run with their own output captured)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--data-bin", help="a fairseq translation data-bin with a joined dictionary "
                   "(default: a synthetic one made with fairseq-preprocess)")
    p.add_argument("--arch-size", choices=list(ARCHS), help="default: base on CPU, big on CUDA")
    p.add_argument("--layers", type=int, help="encoder and decoder layers (default: 2 on CPU, the arch's on CUDA)")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--max-tokens", type=int, help="default: 1024 on CPU, 8192 on CUDA")
    p.add_argument("--steps", type=int, help="timed steps per repeat (default: 3 on CPU, 10 on CUDA)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: 1 on CPU, 3 on CUDA)")
    p.add_argument("--repeats", type=int, help="timed repeats, median reported (default: 2 on CPU, 3 on CUDA)")
    p.add_argument("--vocab", type=int, help="synthetic corpus word types (default: 8000 on CPU, 32000 on CUDA)")
    p.add_argument("--ls-stack", action="store_true",
                   help="the ls side also uses ls_label_smoothed_cross_entropy and ls_adam")
    p.add_argument("--extra", default="", help="more fairseq-train arguments for both models, e.g. "
                   "\"--dropout 0 --attention-dropout 0\" (quoted, one string)")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the runs (CPU)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a._child:
        spec = json.loads(a._child)
        res = run_case(spec["args"], spec["samples"], spec["warmup"], spec["steps"], spec["repeats"])
        print("RESULT " + json.dumps(res), flush=True)
        return

    cpu = a.device == "cpu"
    size = a.arch_size or ("base" if cpu else "big")
    layers = a.layers if a.layers is not None else (2 if cpu else None)
    max_tokens = a.max_tokens or (1024 if cpu else 8192)
    steps = a.steps or (3 if cpu else 10)
    warmup = a.warmup if a.warmup is not None else (1 if cpu else 3)
    repeats = a.repeats or (2 if cpu else 3)
    vocab = a.vocab or (8000 if cpu else 32000)
    precisions = [x for x, on in (("fp16", a.fp16), ("bf16", a.bf16)) if on] or (["fp32"] if cpu else ["fp16", "bf16"])
    if not cpu:
        import torch
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device")

    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_")
    n_batches = warmup + steps * repeats
    data_bin = a.data_bin
    if data_bin is None:
        n_sent = max(1000, n_batches * max_tokens // 24 + 500)
        t0 = time.perf_counter()
        data_bin = make_data_bin(tmp.name, n_sent, vocab)
        print(f"synthetic data-bin: {n_sent} sentence pairs, {vocab} word types "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

    arch = ARCHS[size]
    lay = f", {layers} encoder + {layers} decoder layers (reduced)" if layers else ""
    print(f"device {a.device}, {arch} vs ls_{arch}{lay}, max-tokens {max_tokens}, warmup {warmup}, "
          f"{repeats} x {steps} timed steps (median), "
          f"{'ls criterion+ls_adam on the ls side' if a.ls_stack else 'same criterion/optimizer (adam)'}"
          f"{', extra: ' + a.extra if a.extra else ''}",
          flush=True)
    # one list of batches for every run (batching does not depend on the precision)
    import torch
    samples = draw_samples(train_args(data_bin, arch, a.device, "fp32", max_tokens, layers, extra=a.extra.split()),
                           n_batches)
    spath = os.path.join(tmp.name, "samples.pt")
    torch.save(samples, spath)
    print(f"{len(samples)} batches from fairseq's loader, {sum(s['ntokens'] for s in samples)} target tokens",
          flush=True)
    results = []
    for prec in precisions:
        row = {"precision": prec}
        for name, model_arch in (("fairseq", arch), ("ls", "ls_" + arch)):
            args_list = train_args(data_bin, model_arch, a.device, prec, max_tokens, layers, ls_stack=a.ls_stack,
                                   extra=a.extra.split())
            row[name] = run_child(args_list, spath, warmup, steps, repeats, a.threads)
        row["speedup"] = row["ls"]["wps"] / row["fairseq"]["wps"]
        row["memory_ratio"] = row["ls"]["peak_mb"] / max(row["fairseq"]["peak_mb"], 1e-9)
        results.append(row)
        f, l = row["fairseq"], row["ls"]
        print(f"[{prec}] peak memory = {f['peak_kind']}", flush=True)
        print(f"[{prec}] {'model':<26}{'wps (tgt tok/s)':>16}{'src+tgt tok/s':>15}{'s/step':>9}{'peak MiB':>10}", flush=True)
        for n, r in (("transformer (fairseq)", f), ("ls_transformer", l)):
            print(f"[{prec}] {n:<26}{r['wps']:>16.0f}{r['tokens_per_s']:>15.0f}{r['sec_per_step']:>9.3f}"
                  f"{r['peak_mb']:>10.0f}", flush=True)
        print(f"[{prec}] ls/fairseq throughput ratio {row['speedup']:.2f}x, peak memory ratio "
              f"{row['memory_ratio']:.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": a.device, "arch": arch, "layers": layers, "max_tokens": max_tokens,
                       "steps": steps, "warmup": warmup, "repeats": repeats, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
