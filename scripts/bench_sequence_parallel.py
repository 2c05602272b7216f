"""Memory and communication per rank of sequence parallelism (SP): rank 0 of a group of P ranks, run in
ONE process over torch's fake process group (collectives allocate their outputs and send nothing), so
one device measures one rank's share of one long sequence.

    python -m scripts.bench_sequence_parallel                          # Transformer-big, the CPU grid
    python -m scripts.bench_sequence_parallel --lengths 1k 2k --sizes 1 2 4 --modes ulysses
    python -m scripts.bench_sequence_parallel --device cuda --dtype bf16 --max-gib 120   # GPU table
    python -m scripts.bench_sequence_parallel --gloo                   # + a real 2-process gloo run
    python -m scripts.bench_sequence_parallel --arch ls_transformer_lm_gpt --vocab 50000 \
        --fake-only --attention sdpa --dtype bf16 --lengths 1k 8k 50000    # the LM, GPT-2 small's shape

Model: ls_transformer built by fairseq's build_model with a small Dictionary (--vocab symbols),
Transformer-big widths by default (E 1024, 16 heads, FFN 4096, 6+6 layers), all dropouts 0.1, the
ls_label_smoothed_cross_entropy criterion; a batch of B sentences with S = T tokens, no padding.
--arch NAME: any arch of fairseq_lightseq/models/families.py's table instead, with its fairseq defaults
(width flags given explicitly override them) and its family's criterion: e.g. ls_transformer_lm_gpt
(E 768, 12 heads, FFN 3072, 12 layers: GPT-2 small's shape) or ls_transformer_lm_gpt2_small (1024, 16,
4096, 24: GPT-2 medium's; fairseq's gpt2 names are one size up), the decoder-only language model with
ls_cross_entropy on B blocks of T tokens. A ulysses cell
whose P does not divide the heads is left out (the model refuses it at build); allgather runs it.

Per cell (mode, P, T), two measurements:
- fake (every cell): the forward + backward under torch's FakeTensorMode (shapes only: neither memory
  nor compute; the parameters stay real): bytes saved for backward and bytes sent. Nothing is skipped.
- real (cells whose estimated memory fits --max-gib): one forward + backward on real tensors (saved
  bytes, bytes sent, CUDA peak memory = max_memory_allocated over the step, parameters and gradients
  included; null on CPU), then --warmup untimed and --reps timed forward+backward steps: the median.
  Cells over the budget say "skipped (memory)". Estimate: 2 x parameter bytes + 1.5 x fake saved bytes.
Saved bytes: every storage autograd keeps for backward, counted once (bench_support/saved_bytes.py),
parameters excluded. Bytes sent (per direction; forward = backward): the counters of
fairseq_lightseq.sequence_parallel.collectives, checked against the volume formulas
(bench_support/sp_cells.expected_bytes, docs/usage.md) for the whole model.

--attention sdpa runs torch's fused attention on the CPU too (the model's --ls-attention sdpa: nothing T x T
kept for backward; the dropout then draws from torch's generator). The model is built with its family's
fairseq task (language_modeling, translation), whose rows are right padded: the decoder's causal
self-attention then runs SDPA without a padding mask (ops.blocks.attention.sdpa_key_padding_mask). With the explicit attention, a
sharded call passes its coordinates to the compiled softmax-dropout op (the single-process masks).
"""
import argparse
import json
import os
import sys
import time

import torch

from scripts.bench_support import check_args

MIB, GIB = 2 ** 20, 2 ** 30


def _length(s: str) -> int:
    s = s.lower()
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=["ulysses", "allgather"], choices=["ulysses", "allgather"])
    p.add_argument("--sizes", nargs="+", type=int, default=[1, 2, 4, 8], metavar="P")
    p.add_argument("--lengths", nargs="+", type=_length, default=[_length(x) for x in "1k 2k 4k 8k 16k 32k".split()],
                   metavar="T", help="S = T tokens per sentence (1k = 1024)")
    p.add_argument("--batch", type=int, default=1, metavar="B")
    p.add_argument("--arch", help="an ls_* arch of fairseq_lightseq.models.families (default: ls_transformer with the "
                                  "widths below); its fairseq defaults set the widths not given")
    p.add_argument("--embed-dim", type=int, help="default 1024 (without --arch)")
    p.add_argument("--ffn-dim", type=int, help="default 4096 (without --arch)")
    p.add_argument("--heads", type=int, help="default 16 (without --arch)")
    p.add_argument("--layers", type=int, help="encoder layers = decoder layers; default 6 (without --arch)")
    p.add_argument("--vocab", type=int, default=1000, help="dictionary symbols (plus fairseq's 4 special ones)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--attention-dropout", type=float, metavar="P",
                   help="the attention probabilities' (default: --dropout). 0 with --attention sdpa on the CPU: "
                        "torch's flash kernel, which keeps what the CUDA ones keep (its math fallback for "
                        "dropout keeps [B, H, Tq, Tk])")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bf16"], default="float32")
    p.add_argument("--attention", choices=["explicit", "sdpa"], default="explicit",
                   help="explicit: bmm + the fused softmax-dropout op on CPU (keeps [B, H, Tq, Tk]); sdpa: torch's "
                        "fused attention on every device (the default on CUDA whatever this says)")
    p.add_argument("--max-gib", type=float, default=8.0, help="memory budget of a real cell (estimated)")
    p.add_argument("--fake-only", action="store_true", help="no real cells")
    p.add_argument("--real-max-length", type=_length, default=0, metavar="T",
                   help="real cells only up to this T (0: no limit; the others fake only)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed steps before the timed ones (after the untimed measuring step)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--gloo", action="store_true", help="also a real 2-process gloo run on the CPU (P=2 vs P=1)")
    p.add_argument("--gloo-only", action="store_true", help="only the gloo run")
    p.add_argument("--gloo-length", type=int, default=256, metavar="T")
    p.add_argument("--gloo-embed-dim", type=int, default=256)
    p.add_argument("--gloo-layers", type=int, default=2)
    p.add_argument("--gloo-steps", type=int, default=5)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--table-from", metavar="PATH", help="only print the table of a JSON this script wrote")
    check_args.add(p)
    a = p.parse_args(argv)
    try:
        _widths(a)
    except ValueError as e:
        p.error(f"--arch: {e}")
    for P in [] if a.gloo_only else a.sizes:
        if P < 1:
            p.error(f"--sizes: P must be >= 1, got {P}")
        if a.modes == ["ulysses"] and a.heads % P:
            p.error(f"--sizes {P} with --modes ulysses needs --heads ({a.heads}) divisible by P")
    if (a.gloo or a.gloo_only) and a.modes[0] == "ulysses" and a.heads % 2:
        p.error(f"--gloo with --modes ulysses needs --heads ({a.heads}) divisible by 2")
    if a.dtype == "bf16" and a.device != "cuda" and not a.fake_only:
        p.error("--dtype bf16 needs --device cuda or --fake-only (the CPU runs float32)")
    if a.device == "cuda" and not torch.cuda.is_available() and not a.check_args:
        p.error("--device cuda: no CUDA device")
    check_args.finish(a, "bench_sequence_parallel.py")
    return a


def _widths(a) -> None:
    """Fills the width flags left unset: from --arch's fairseq arch function, else Transformer-big's."""
    defaults = {"embed_dim": 1024, "ffn_dim": 4096, "heads": 16, "layers": 6}
    if a.arch:
        from argparse import Namespace

        from fairseq_lightseq.models.families import family_of

        ns = Namespace()
        family_of(a.arch).architectures[a.arch](ns)
        defaults = {"embed_dim": ns.decoder_embed_dim, "ffn_dim": ns.decoder_ffn_embed_dim,
                    "heads": ns.decoder_attention_heads, "layers": ns.decoder_layers}
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _save(path, out: dict) -> None:
    """Writes `out` with this tree's commit and without the machine's paths (bench_support/provenance.py)."""
    from scripts.bench_support.provenance import record

    if path:
        with open(path, "w") as f:
            json.dump(record(out, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), f, indent=1)


def run_grid(a, out: dict) -> None:
    """Fills out["config"] and out["cells"], saving the JSON after every cell (a long grid stopped early
    keeps what it measured)."""
    from scripts.bench_support import sp_cells
    from fairseq_lightseq import ops
    from fairseq_lightseq.models.common import set_attention_mode
    from fairseq_lightseq.modules import multihead_attention

    if a.threads:
        torch.set_num_threads(a.threads)
    mode = "sdpa" if a.attention == "sdpa" else "auto"  # --ls-attention's value
    cfg = {"arch": a.arch, "embed_dim": a.embed_dim, "ffn_dim": a.ffn_dim, "heads": a.heads, "layers": a.layers,
           "vocab": a.vocab, "dropout": a.dropout, "attention_dropout": a.attention_dropout}
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    elem = torch.finfo(dtype).bits // 8
    t0 = time.perf_counter()
    task, model, criterion = sp_cells.build(cfg, max(a.lengths) + 8)
    set_attention_mode(model, mode)
    model.to(device=a.device, dtype=dtype)
    shape, decoder_only = sp_cells.shape(model), sp_cells.decoder_only(model)
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    _log(f"model built: {sum(p.numel() for p in params) / 1e6:.1f}M parameters ({param_bytes / GIB:.2f} GiB), "
         f"{time.perf_counter() - t0:.0f} s")
    out["config"] = {**cfg, **shape, "batch": a.batch, "device": a.device, "dtype": a.dtype, "attention": a.attention,
                     "max_gib": a.max_gib, "real_max_length": a.real_max_length,
                     "warmup": a.warmup, "reps": a.reps, "threads": torch.get_num_threads(),
                     "parameters": sum(p.numel() for p in params), "parameter_bytes": param_bytes,
                     "device_name": torch.cuda.get_device_name() if a.device == "cuda" else "cpu"}
    # CUDA, or no attention dropout: torch's fused attention
    sdpa = multihead_attention.use_sdpa(torch.empty(0, device=a.device), a.attention_dropout, mode=mode)
    attention = "sdpa" if sdpa else "kernel" if ops.has_kernel("attention_softmax_fwd", a.device) else "reference"
    cells = out["cells"] = []
    grid = [(T, P, m) for T in a.lengths for P in a.sizes for m in a.modes if not (P == 1 and m != a.modes[0])
            and not (P > 1 and m == "ulysses" and a.heads % P)]
    left_out = sorted({P for P in a.sizes if P > 1 and "ulysses" in a.modes and a.heads % P})
    if left_out:
        _log(f"ulysses left out at P = {left_out}: --heads {a.heads} is not divisible (the model refuses it)")
    for i, (T, P, mode) in enumerate(grid):
        group = sp_cells.set_group(P)
        smp = sp_cells.sample(task, a.batch, T, a.device, decoder_only=decoder_only)
        exp = sp_cells.expected_bytes(mode, P, T, T, a.batch, shape["embed_dim"], shape["encoder_layers"],
                                      shape["decoder_layers"], elem, decoder_only)
        cell = {"mode": mode if P > 1 else "none", "P": P, "T": T, "S": 0 if decoder_only else T, "B": a.batch,
                "expected_sent": exp}
        fk = sp_cells.fake_cell(model, criterion, smp, group, P, mode)
        cell["fake"] = fk
        cell["attention"] = attention
        if mode == "allgather" and P > 1:
            # causal keys are truncated at a rank's last row: the last rank keeps the most (fake only)
            last = sp_cells.fake_cell(model, criterion, smp, sp_cells.set_group(P, P - 1), P, mode)
            cell["fake_last_rank"] = {"rank": P - 1, "saved_bytes": last["saved_bytes"], "sent": last["sent"]}
            group = sp_cells.set_group(P)
        est = 2 * param_bytes + 1.5 * fk["saved_bytes"]
        cell["estimated_bytes"] = est
        where = f"[{i + 1}/{len(grid)}] {cell['mode']} P={P} T={T}"
        ok = fk["sent"]["forward"] == fk["sent"]["backward"] == exp["total"]
        _log(f"{where}: fake saved {fk['saved_bytes'] / MIB:.1f} MiB, sent {fk['sent']['forward'] / MIB:.2f} MiB "
             f"per direction (formula {exp['total'] / MIB:.2f}: {'equal' if ok else 'DIFFERENT'}), "
             f"{fk['seconds']:.1f} s")
        if a.fake_only or (a.real_max_length and T > a.real_max_length):
            cell["real"] = {"skipped": "--fake-only" if a.fake_only else "time (T > --real-max-length)"}
        elif est > a.max_gib * GIB:
            cell["real"] = {"skipped": f"memory (estimated {est / GIB:.1f} GiB > --max-gib {a.max_gib})"}
            _log(f"{where}: real skipped (memory: estimated {est / GIB:.1f} GiB)")
        else:
            t1 = time.perf_counter()
            r = sp_cells.real_cell(model, criterion, smp, group, P, mode, a.warmup, a.reps)
            cell["real"] = r
            _log(f"{where}: real saved {r['saved_bytes'] / MIB:.1f} MiB, fwd+bwd median {r['median_seconds']:.3f} s "
                 f"({time.perf_counter() - t1:.0f} s)")
        cells.append(cell)
        _save(a.json, out)
    sp_cells.set_group(1)


def _mib(n) -> str:
    return "" if n is None else f"{n / MIB:,.2f}"


def _last(c: dict, base: dict) -> str:
    last = c.get("fake_last_rank")
    if last is None:
        return "= rank 0" if c["P"] > 1 else ""
    return f"{_mib(last['saved_bytes'])}, {last['saved_bytes'] / base[c['T']]:.3f}" if c["T"] in base else \
        _mib(last["saved_bytes"])


def table(res: dict) -> str:
    """The markdown table: one row per cell."""
    rows = ["| mode | P | T=S | saved for backward MiB: real (fake) | fake vs P=1 | sent per direction MiB (formula) | "
            "CUDA peak MiB | fwd+bwd s (median) | measured | attention probs | last rank: saved MiB (fake), vs P=1 |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {}
    for c in res["cells"]:
        real = c["real"]
        measured = "real" if "saved_bytes" in real else "fake"
        saved = real["saved_bytes"] if measured == "real" else c["fake"]["saved_bytes"]
        if c["P"] == 1:
            base[c["T"]] = c["fake"]["saved_bytes"]
        ratio = c["fake"]["saved_bytes"] / base[c["T"]] if c["T"] in base else None
        sent = c["fake"]["sent"]["forward"]
        exp = c["expected_sent"]["total"]
        sent_s = f"{_mib(sent)} ({_mib(exp)}{'' if sent == exp else ' DIFFERENT'})"
        if measured == "real":
            time_s = f"{real['median_seconds']:.3f}"
            peak = _mib(real["cuda_peak_bytes"]) or "n/a (CPU)"
        else:
            time_s = peak = "skipped (memory)" if real["skipped"].startswith("memory") else \
                "skipped (time)" if real["skipped"].startswith("time") else "not run"
        saved_s = f"{_mib(saved)} ({_mib(c['fake']['saved_bytes'])})" if measured == "real" else \
            f"({_mib(c['fake']['saved_bytes'])})"
        rows.append(f"| {c['mode']} | {c['P']} | {c['T']} | {saved_s} | "
                    f"{'' if ratio is None else f'{ratio:.3f}'} | {sent_s} | {peak} | {time_s} | {measured} | "
                    f"{c.get('attention', '')} | {_last(c, base)} |")
    return "\n".join(rows)


def summary(res: dict) -> str:
    """One row per T, a column per (mode, P): GiB one rank keeps for backward (fake count; allgather: its
    last rank's, which keeps the most) / MiB it sends per direction."""
    cols = list(dict.fromkeys((c["mode"], c["P"]) for c in res["cells"]))
    cells = {(c["mode"], c["P"], c["T"]): c for c in res["cells"]}
    rows = ["| T | " + " | ".join(f"{m} P={P}" for m, P in cols) + " |", "|---|" + "---|" * len(cols)]
    for T in dict.fromkeys(c["T"] for c in res["cells"]):
        out = []
        for m, P in cols:
            c = cells.get((m, P, T))
            if c is None:
                out.append("")
                continue
            saved = max(c["fake"]["saved_bytes"], c.get("fake_last_rank", {}).get("saved_bytes", 0))
            out.append(f"{saved / GIB:,.2f} / {c['fake']['sent']['forward'] / MIB:,.0f}")
        rows.append(f"| {T} | " + " | ".join(out) + " |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.table_from:
        with open(a.table_from) as f:
            res = json.load(f)
        print(table(res) + "\n\n" + summary(res) if res.get("cells") else "no cells in " + a.table_from)
        return res
    out = {"command": " ".join(["python", "-m", "scripts.bench_sequence_parallel"] + list(sys.argv[1:] if argv is None
                                                                                   else argv))}
    if not a.gloo_only:
        run_grid(a, out)
    if a.gloo or a.gloo_only:
        from scripts.bench_support import sp_gloo

        cfg = {"arch": a.arch, "embed_dim": a.gloo_embed_dim, "ffn_dim": 4 * a.gloo_embed_dim, "heads": a.heads,
               "layers": a.gloo_layers, "vocab": a.vocab, "dropout": a.dropout}
        out["gloo"] = sp_gloo.run(cfg, a.modes[0], a.batch, a.gloo_length, 1, a.gloo_steps, 1, log=_log)
    _save(a.json, out)
    if "cells" in out:
        print(table(out))
        print(f"\nsaved / sent: fake tensors for every cell, real ones where 'measured' says real; 'vs P=1': fake "
              f"saved bytes over P=1's; 'last rank': allgather's rank P-1 (its causal keys are all T; the other "
              f"modes' ranks keep equal shares). Sent: bytes rank 0 sends per direction (forward = backward). "
              f"Time: median of {a.reps} forward+backward steps after the untimed measuring step and {a.warmup} "
              f"warm-up step(s) ({out['config']['threads']} threads, {out['config']['device_name']}, {a.dtype}, "
              f"attention {a.attention}). 'attention probs': the softmax-dropout that ran (kernel: the compiled "
              f"op, with the shard's coordinates; reference: its pure-PyTorch version, without a compiled library; "
              f"sdpa: torch's fused attention).")
        print("\nPer rank: GiB kept for backward (the most any rank keeps) / MiB sent per direction\n")
        print(summary(out))
    if "gloo" in out:
        g = out["gloo"]
        print(f"\ngloo on this CPU, {g['mode']}, B={g['B']} T={g['T']}: P=1 {g['p1_tokens_per_s']:.0f} tokens/s, "
              f"P=2 {g['p2_tokens_per_s']:.0f} tokens/s, ratio {g['ratio_p2_over_p1']:.2f} (one machine's cores shared by both ranks: a run, not a "
              f"speed-up)")
    return out


if __name__ == "__main__":
    main()
