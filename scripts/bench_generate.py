"""Decoding speed through fairseq-generate's path, ls_transformer vs fairseq's transformer on the same weights.

    python -m scripts.bench_generate                       # CPU: the demo's widths, 1000 sentences, beam 5, batch 64, 2 threads
    python -m scripts.bench_generate --rounds 6 --json out.json
    python -m scripts.bench_generate --data-bin BIN --path CKPT --gen-subset test   # a trained model (either side's checkpoint)
    python -m scripts.bench_generate --device cuda --threads 0                      # on a GPU (see docs/gpu_check.md)
    python -m scripts.bench_generate --profile 4           # + torch.profiler's top ops of 4 batches per side

Method:
- Weights: by default a randomly initialised ls_transformer (fairseq's initialisation, the demo's widths:
  2+2 layers, d 128, FFN 256, 4 heads, shared embeddings) saved by fairseq's Trainer, on a synthetic
  corpus (bench_support/corpus.py: Zipf-like words, source lengths log-normal around 24; --vocab
  entries); its fairseq twin is the same file converted with scripts/convert_checkpoint.py --to fairseq.
  With --path, that checkpoint (ls or fairseq's) and its converted twin.
- Lengths: a random model's hypotheses end wherever its noise puts </s>, so by default every hypothesis
  is made exactly --tgt-len tokens long (--min-len L --max-len-a 0 --max-len-b L): both sides then run
  the same number of decoder steps on the same batch sizes whatever their rounding does to the scores,
  and steps are as long as a trained model's on the same sentences. --tgt-len 0 keeps fairseq's
  defaults (a trained model's own lengths; the hypotheses agreement below says whether both sides did
  the same work).
- Decoding: what fairseq_cli.generate does: its generation parser and arguments (beam, batch size,
  --required-batch-size-multiple 1), checkpoint_utils.load_model_ensemble, prepare_for_inference_,
  task.get_batch_iterator over --gen-subset, task.build_generator (SequenceGenerator), and per batch
  task.inference_step, the call fairseq-generate times; the timed region is that call and nothing
  else (no printing, detokenising or scoring). Both sides pass --user-dir fairseq_lightseq (the
  checkpoint loader needs it, see generate_args); the native side's model is fairseq's transformer.
- Each side runs in its own process, in turns (round 1: ls, native; round 2: ls, native; ...; started
  as scripts/benchmark.py starts its sides, bench_support/children.py): a process loads the model,
  decodes --warmup batches untimed, then every batch once, timed.
- Reported per side: sentences/s and tokens/s (best hypotheses' tokens, </s> included, as
  fairseq-generate counts them) over all rounds; the speed ratio ls/native (sum of native time over
  sum of ls time), its median and IQR over rounds and over batches (batch k of round r against the
  other side's batch k of round r); how many best hypotheses agree between the sides; the machine
  (CPU, threads, torch, load averages before, after and per process).
"""
import argparse
import os
import sys
import tempfile
import time

from scripts.bench_support import check_args, children

SIDES = ("ls", "native")
# The demo's model (fairseq_lightseq/demo/__main__.py), the one the decoding rows of results.csv decode.
DEMO_WIDTHS = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128 "
               "--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 "
               "--decoder-attention-heads 4 --dropout 0.1")


def make_checkpoint(a, data_bin: str, path: str) -> None:
    """A randomly initialised ls_transformer saved as fairseq-train saves one (fairseq's Trainer)."""
    from scripts.bench_support.families import FAMILIES
    from scripts.bench_support.sides import build_trainer, train_args

    args = train_args(FAMILIES["translation"], data_bin, a.repo, "ls", "base", "cpu", "fp32", (1024, None),
                      extra=a.model_args.split())
    _, _, trainer = build_trainer(args)
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(path, {})


def twin_checkpoints(src: str, tmp: str) -> dict:
    """{side: path}: src and its conversion to the other implementation (same weights)."""
    import torch

    from fairseq_lightseq.checkpoints.convert import convert_state
    from fairseq_lightseq.models.families import PREFIX

    state = torch.load(src, map_location="cpu", weights_only=False)
    cfg_model = state["cfg"]["model"] if state.get("cfg") is not None else state["args"]
    arch = cfg_model["_name"] if isinstance(cfg_model, dict) else getattr(cfg_model, "arch", None) or cfg_model._name
    ours = arch.startswith(PREFIX)
    convert_state(state, "fairseq" if ours else "lightseq")
    twin = os.path.join(tmp, "twin.pt")
    torch.save(state, twin)
    return {"ls": src, "native": twin} if ours else {"ls": twin, "native": src}


def generate_args(a, data_bin: str, path: str) -> list:
    """fairseq-generate's arguments. Both sides get --user-dir: torch >= 2.6's safe loader needs the
    plugin's allowlist (fairseq_lightseq/checkpoints/safety.py) for any fairseq-train checkpoint, and
    the native side's model is fairseq's own code either way."""
    args = [data_bin, "--path", path, "--gen-subset", a.gen_subset, "--beam", str(a.beam),
            "--batch-size", str(a.batch_size), "--required-batch-size-multiple", "1", "--nbest", "1",
            "--seed", "1", "--num-workers", "0"]
    if a.tgt_len:
        args += ["--min-len", str(a.tgt_len), "--max-len-a", "0", "--max-len-b", str(a.tgt_len)]
    if a.device == "cpu":
        args.append("--cpu")
    if a.fp16:
        args.append("--fp16")
    return args + ["--user-dir", os.path.join(a.repo, "fairseq_lightseq")] + a.extra.split()


def decode_side(spec: dict) -> dict:
    """The child: fairseq_cli.generate's setup, then spec["warmup"] untimed batches and every batch
    timed (task.inference_step). Returns per-batch seconds, sentences, tokens, the hypotheses' digest
    and, with spec["profile"], torch.profiler's top ops over that many batches."""
    import torch
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    args = options.parse_args_and_arch(options.get_generation_parser(), input_args=spec["args"])
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    cuda = torch.cuda.is_available() and not cfg.common.cpu
    task = tasks.setup_task(cfg.task)
    models, saved_cfg = checkpoint_utils.load_model_ensemble(utils.split_paths(cfg.common_eval.path), task=task)
    task.load_dataset(cfg.dataset.gen_subset, task_cfg=saved_cfg.task)
    for model in models:
        if cfg.common.fp16:
            model.half()
        if cuda:
            model.cuda()
        model.prepare_for_inference_(cfg)
    batches = list(task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.gen_subset), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models]),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_workers=0).next_epoch_itr(shuffle=False))
    if cuda:
        batches = [utils.move_to_cuda(b) for b in batches]
    generator = task.build_generator(models, cfg.generation)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def decode(sample):
        return task.inference_step(generator, models, sample)

    for i in range(spec["warmup"]):
        decode(batches[i % len(batches)])
    times, sentences, tokens, hyps = [], [], [], {}
    load = os.getloadavg()
    for sample in batches:
        sync()
        t0 = time.perf_counter()
        hypos = decode(sample)
        sync()
        times.append(time.perf_counter() - t0)
        sentences.append(len(hypos))
        tokens.append(sum(len(h[0]["tokens"]) for h in hypos))
        hyps.update((sid, h[0]["tokens"].tolist()) for sid, h in zip(sample["id"].tolist(), hypos))
    out = {"times": times, "sentences": sentences, "tokens": tokens, "hypotheses": hyps,
           "threads": torch.get_num_threads(), "loadavg_at_start": load, "model": type(models[0]).__name__}
    if spec.get("profile"):
        from scripts.bench_support.timing import op_breakdown
        from torch.profiler import ProfilerActivity, profile

        n = spec["profile"]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(n):
                decode(batches[i % len(batches)])
        out["ops"] = op_breakdown(prof, n, spec.get("profile_top", 25))
    return out


def summarize(runs: dict) -> dict:
    """Per side: sentences/s, tokens/s over all rounds and per round; ls's speed over native's: the
    ratio of summed times, and the median and IQR of per-round and per-batch time ratios native/ls."""
    from scripts.benchmark import quartiles

    out = {}
    for side, rs in runs.items():
        t = sum(sum(r["times"]) for r in rs)
        n, k = sum(sum(r["sentences"]) for r in rs), sum(sum(r["tokens"]) for r in rs)
        out[side] = {"sentences_per_s": n / t, "tokens_per_s": k / t, "seconds": t,
                     "sentences_per_round": sum(rs[0]["sentences"]), "tokens_per_round": sum(rs[0]["tokens"]),
                     "per_round_sentences_per_s": [sum(r["sentences"]) / sum(r["times"]) for r in rs],
                     "batch_s": [r["times"] for r in rs], "threads": rs[0]["threads"], "model": rs[0]["model"],
                     "loadavg_at_start": [r["loadavg_at_start"] for r in rs]}
    ls, nat = runs["ls"], runs["native"]
    per_round = [sum(b["times"]) / sum(a["times"]) for a, b in zip(ls, nat)]
    per_batch = [tb / ta for a, b in zip(ls, nat) for ta, tb in zip(a["times"], b["times"])]
    ratio = {"sum": out["native"]["seconds"] / out["ls"]["seconds"], "per_round": per_round}
    for key, xs in (("rounds", per_round), ("batches", per_batch)):
        q1, q2, q3 = quartiles(xs)
        ratio[key] = {"median": q2, "q1": q1, "q3": q3, "n": len(xs)}
    a, b = ls[0]["hypotheses"], nat[0]["hypotheses"]
    same = sum(a[s] == b.get(s) for s in a)
    return {"sides": out, "ls_speed_over_native": ratio,
            "hypotheses": {"sentences": len(a), "identical": same,
                           "same_tokens_per_side": out["ls"]["tokens_per_round"] == out["native"]["tokens_per_round"]}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default: %(default)s")
    p.add_argument("--data-bin", help="a translation data-bin with a joined dictionary (default: the synthetic "
                   "corpus, --sentences pairs, decoded as its train split)")
    p.add_argument("--path", help="a checkpoint of either side (default: a random ls_transformer of --model-args)")
    p.add_argument("--gen-subset", help="the split to decode (default: test with --data-bin, train otherwise)")
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "fls_bench_cache"),
                   help="where the synthetic corpus is made once and reused (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=1000, help="synthetic corpus size (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=8000, help="synthetic dictionary size incl. specials "
                   "(default: %(default)s, the demo's sentencepiece size on real data)")
    p.add_argument("--model-args", default=DEMO_WIDTHS, help="fairseq-train arguments of the random model "
                   "(default: the demo's, '%(default)s')")
    p.add_argument("--tgt-len", type=int, help="every hypothesis exactly this many tokens + </s> (0: the "
                   "model's own lengths; default: 24 for the random model, 0 with --path)")
    p.add_argument("--beam", type=int, default=5, help="default: %(default)s")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads per side, 0 for torch's default "
                   "(default: %(default)s)")
    p.add_argument("--fp16", action="store_true", help="decode in fp16 (CUDA)")
    p.add_argument("--rounds", type=int, default=4, help="processes per side, in turns (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches per process (default: %(default)s)")
    p.add_argument("--profile", type=int, default=0, help="after the last round, torch.profiler over this "
                   "many batches per side, the top ops by self CPU time")
    p.add_argument("--extra", default="", help="more fairseq-generate arguments for both sides, quoted")
    p.add_argument("--json", help="write the results here")
    children.add_args(p)
    a = children.parse(p, argv)
    if a._child:
        return a
    if a.path and not a.data_bin:
        p.error("--path needs the --data-bin it was trained on")
    for name, val, lo in (("--rounds", a.rounds, 1), ("--warmup", a.warmup, 0), ("--beam", a.beam, 1),
                          ("--batch-size", a.batch_size, 1), ("--sentences", a.sentences, 1),
                          ("--threads", a.threads, 0), ("--profile", a.profile, 0)):
        if val < lo:
            p.error(f"{name} {val}: must be >= {lo}")
    a.tgt_len = a.tgt_len if a.tgt_len is not None else (0 if a.path else 24)
    a.gen_subset = a.gen_subset or ("test" if a.data_bin else "train")
    if a.fp16 and a.device != "cuda":
        p.error("--fp16: CUDA only (fairseq-generate's CPU fp16 runs the reference ops)")
    return a


def main(argv=None):
    a = parse_args(argv)
    if a._child:
        children.serve(decode_side, a._child)
        return
    check_args.finish(a, "bench_generate.py")  # the rehearsal stops here: no CUDA device needed
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_generate.py: --device cuda: no CUDA device")
    children.use_tree(a.repo)
    import logging
    import warnings
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from scripts.benchmark import finish
    from scripts.bench_support.corpus import synthetic_data_bin

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    tmp = tempfile.TemporaryDirectory(prefix="fls_bench_gen_")
    data_bin = a.data_bin or synthetic_data_bin(a.cache_dir, a.sentences, a.vocab)
    src = a.path
    if src is None:
        src = os.path.join(tmp.name, "random_ls.pt")
        make_checkpoint(a, data_bin, src)
    paths = twin_checkpoints(src, tmp.name)
    print(f"bench_generate: {a.gen_subset} of {data_bin}; {'random model: ' + a.model_args if not a.path else a.path}; "
          f"beam {a.beam}, batch {a.batch_size}, {a.threads or 'default'} threads, "
          f"{'every hypothesis ' + str(a.tgt_len) + ' tokens + </s>' if a.tgt_len else 'the model lengths'}; "
          f"{a.rounds} rounds of {', '.join(SIDES)} in turns, {a.warmup} warm-up batches each", flush=True)
    runs = {s: [] for s in SIDES}
    for r in range(a.rounds):
        for side in SIDES:
            spec = {"args": generate_args(a, data_bin, paths[side]), "threads": a.threads,
                    "warmup": a.warmup, "profile": a.profile if r == a.rounds - 1 else 0}
            res = children.run("scripts.bench_generate:decode_side", spec, a.repo, a.threads, fork=a.device == "cpu")
            runs[side].append(res)
            print(f"  round {r + 1}/{a.rounds} {side:<7} {sum(res['sentences']) / sum(res['times']):8.1f} sentences/s"
                  f"  ({sum(res['times']):.2f} s; load {res['loadavg_at_start'][0]:.1f})", flush=True)
    res = summarize(runs)
    ops = {s: runs[s][-1].get("ops") for s in SIDES if runs[s][-1].get("ops")}
    for s in SIDES:
        row = res["sides"][s]
        print(f"{s:<7} {row['sentences_per_s']:8.1f} sentences/s {row['tokens_per_s']:9.0f} tokens/s "
              f"({row['sentences_per_round']} sentences, {row['tokens_per_round']} tokens per round)", flush=True)
    q = res["ls_speed_over_native"]
    h = res["hypotheses"]
    print(f"ls speed / native: {q['sum']:.3f}x (summed times); per round median {q['rounds']['median']:.3f} "
          f"[IQR {q['rounds']['q1']:.3f}, {q['rounds']['q3']:.3f}]; per batch median {q['batches']['median']:.3f} "
          f"[IQR {q['batches']['q1']:.3f}, {q['batches']['q3']:.3f}]; identical best hypotheses "
          f"{h['identical']}/{h['sentences']}", flush=True)
    for s, o in ops.items():
        print(f"-- {s}: top ops by self CPU time (torch.profiler, {a.profile} batches; per batch; "
              f"profiled self CPU {o['self_cpu_ms_per_step']:.1f} ms/batch, {o['op_calls_per_step']:.0f} op calls)")
        for e in o["top"]:
            print(f"   {e['name'][:60]:<60}{e['self_cpu_ms_per_step']:>9.2f} ms{e['calls_per_step']:>8.0f} calls")
    res.update({"script": "bench_generate.py", "data_bin": data_bin, "gen_subset": a.gen_subset,
                "checkpoint": a.path or "random", "model_args": None if a.path else a.model_args,
                "tgt_len": a.tgt_len, "beam": a.beam, "batch_size": a.batch_size, "threads": a.threads,
                "device": a.device, "fp16": a.fp16, "rounds": a.rounds, "warmup": a.warmup, "repo": a.repo,
                "ops": ops})
    finish(res, t0, load_before, argv, a.json)

if __name__ == "__main__":
    main()
