"""One cell of scripts/bench_sequence_parallel.py: rank 0 of a sequence-parallel group of P ranks,
run in this process over torch's fake process group (collectives allocate their outputs and send
nothing; collectives.py still counts the bytes a real group would send).

- `build(cfg)`: the model of cfg's arch (ls_transformer by default, or any arch of
  fairseq_lightseq/models/families.py's table, e.g. ls_transformer_lm_gpt2_small; fairseq's build_model with the
  family's fairseq task, a Dictionary of cfg's vocab) and its family's criterion, all dropouts as given;
- `sample(...)`: B full-length sentences of S = T random tokens (a language model: B blocks of T);
- `expected_bytes(...)`: the bytes one rank sends per direction (forward = backward), from the
  per-layer volume formulas (docs/usage.md);
- `fake_cell(...)`: saved bytes and bytes sent under torch's FakeTensorMode (shapes only: no memory,
  no compute), `real_cell(...)`: the same measured on real tensors, plus CUDA peak memory and
  forward+backward time.
"""
import argparse
import statistics
import time
from fractions import Fraction

import torch
import torch.distributed as dist

from scripts.bench_support.saved_bytes import SavedBytes


class _Task:
    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def _task(family, dictionary):
    """The family's fairseq task (language_modeling, translation with its defaults) over `dictionary`, so
    that the model is built as fairseq-train builds it (the decoder's padding side, right for both, comes
    from the task: models.common.right_padded_targets); a stub with the dictionaries for the others."""
    if family.task == "language_modeling":
        from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

        return LanguageModelingTask(LanguageModelingConfig(), dictionary)
    if family.task == "translation":
        from fairseq.tasks.translation import TranslationConfig, TranslationTask

        return TranslationTask(TranslationConfig(), dictionary, dictionary)
    return _Task(dictionary)


def build(cfg: dict, max_positions: int):
    """(task, model, criterion), float32 on the CPU, train mode. cfg: "arch" (None: ls_transformer), the
    widths embed_dim, ffn_dim, heads, layers (encoder and decoder alike; None: the arch's own), vocab
    symbols, dropout for all three sites (attention_dropout, if given, for the attention's). The arch's function (fairseq's) sets what cfg leaves out; the
    criterion is its family's (fairseq_lightseq/models/families.py), label smoothing 0.1 where it takes one."""
    import fairseq_lightseq  # noqa: F401  (registers the models and criteria)
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq_lightseq.models.families import family_of

    arch = cfg.get("arch") or "ls_transformer"
    family = family_of(arch)
    d = Dictionary()
    for i in range(cfg["vocab"]):
        d.add_symbol(f"w{i}")
    task = _task(family, d)
    widths = {"embed_dim": cfg.get("embed_dim"), "ffn_embed_dim": cfg.get("ffn_dim"),
              "attention_heads": cfg.get("heads"), "layers": cfg.get("layers")}
    p = cfg["dropout"]
    pa = p if cfg.get("attention_dropout") is None else cfg["attention_dropout"]
    args = argparse.Namespace(
        **{f"{side}_{k}": v for side in ("encoder", "decoder") for k, v in widths.items() if v is not None},
        dropout=p, attention_dropout=pa, activation_dropout=p, max_source_positions=max_positions,
        max_target_positions=max_positions, tokens_per_sample=max_positions, arch=arch)
    family.architectures[arch](args)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    criterion = CRITERION_REGISTRY[family.criterion].build_criterion(
        argparse.Namespace(sentence_avg=False, label_smoothing=0.1, ignore_prefix_size=0, report_accuracy=False),
        task)
    model.train()
    criterion.train()
    return task, model, criterion


def stacks(model) -> list:
    """The encoder (none in a language model) and the decoder: the modules that take a SequenceParallel."""
    return [m for m in (getattr(model, "encoder", None), model.decoder) if m is not None]


def decoder_only(model) -> bool:
    """Whether the model has no encoder (a language model)."""
    return getattr(model, "encoder", None) is None


def shape(model) -> dict:
    """The built model's widths: embed_dim, ffn_dim, heads, encoder_layers (0: decoder-only), decoder_layers."""
    layer = model.decoder.layers[0]
    encoder = getattr(model, "encoder", None)
    return {"embed_dim": layer.self_attn.embed_dim, "ffn_dim": layer.fc1.out_features,
            "heads": layer.self_attn.num_heads, "encoder_layers": len(encoder.layers) if encoder is not None else 0,
            "decoder_layers": len(model.decoder.layers)}


def sample(task, B: int, T: int, device, seed: int = 1, decoder_only: bool = False) -> dict:
    """B sentences, S = T tokens each (no padding): src [B, T], prev_output_tokens [B, T] (eos first),
    target [B, T], int64 on `device`. decoder_only (the language_modeling task's sample): src_tokens
    [B, T] and their next tokens as target, no prev_output_tokens."""
    g = torch.Generator().manual_seed(seed)
    d = task.target_dictionary
    src = torch.randint(d.nspecial, len(d), (B, T), generator=g)
    prev = torch.randint(d.nspecial, len(d), (B, T), generator=g)
    prev[:, 0] = d.eos()
    if decoder_only:
        prev = src
    target = torch.cat([prev[:, 1:], torch.full((B, 1), d.eos())], 1)
    net_input = {"src_tokens": src.to(device), "src_lengths": torch.full((B,), T).to(device)}
    if not decoder_only:
        net_input["prev_output_tokens"] = prev.to(device)
    return {"net_input": net_input, "target": target.to(device), "ntokens": B * T}


def expected_bytes(mode: str, P: int, S: int, T: int, B: int, E: int, enc_layers: int, dec_layers: int,
                   elem: int, decoder_only: bool = False) -> dict:
    """Bytes rank 0 sends in one forward (the backward sends the same), by the volume formulas, with
    Ns = S_pad * B and Nt = T_pad * B rows (S, T padded up to multiples of P) and width E:

        ulysses    per encoder layer 4 Ns E (P-1)/P^2 (self-attention: packed q/k/v, then the output);
                   per decoder layer 4 Nt E (P-1)/P^2 (self) + 2 Nt E (P-1)/P^2 (cross: queries, output)
        allgather  per encoder layer 2 Ns E (P-1)/P (keys and values); per decoder layer 2 Nt E (P-1)/P
                   (self; cross-attention sends nothing)
        both       once per forward: the encoder output's gather, Ns E (P-1)/P

    times the element size; decoder_only (a language model: no encoder, no cross-attention): the decoder
    layers' self-attention only. Returns {"self_attention", "cross_attention", "encoder_output", "total"}."""
    if decoder_only:
        S, enc_layers = 0, 0
    if P == 1:
        return {"self_attention": 0, "cross_attention": 0, "encoder_output": 0, "total": 0}
    Ns, Nt = -(-S // P) * P * B, -(-T // P) * P * B
    f = Fraction(P - 1, P)
    if mode == "ulysses":
        self_attn = 4 * E * f / P * (enc_layers * Ns + dec_layers * Nt)
        cross = Fraction(0) if decoder_only else 2 * E * f / P * dec_layers * Nt
    else:
        self_attn = 2 * E * f * (enc_layers * Ns + dec_layers * Nt)
        cross = Fraction(0)
    gather = Ns * E * f
    parts = {"self_attention": self_attn * elem, "cross_attention": cross * elem, "encoder_output": gather * elem}
    assert all(v.denominator == 1 for v in parts.values()), parts
    parts = {k: int(v) for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


class _StorageBytes(SavedBytes):
    """SavedBytes that also works under FakeTensorMode: a storage is keyed by the identity of the
    storage of its tensor's view base (fake tensors have no data pointer, and a fake view of a real
    parameter gets a storage of its own), so parameters and their views are left out either way."""

    def __init__(self, params, fake_mode=None):
        super().__init__(())
        self._skip = {p.untyped_storage()._cdata for p in params}
        if fake_mode is not None:  # the fake copies the mode makes of the parameters (memoised), held
            # here: a freed one's storage address could come back as an activation's and hide it
            self._fake_params = [fake_mode.from_tensor(p) for p in params]
            self._skip |= {p.untyped_storage()._cdata for p in self._fake_params}

    def _add(self, t) -> int:
        root = t._base if t._base is not None else t
        st = root.untyped_storage()
        key = st._cdata
        if st.nbytes() == 0 or key in self._skip or key in self._seen:
            return 0
        self._seen[key] = (st.nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", ""))
        return st.nbytes()


def set_group(P: int, rank: int = 0):
    """This process as `rank` of a fake world of P ranks; returns the group (None for P = 1)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    if P == 1:
        return None
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=P)
    return dist.group.WORLD


def _shard(model, group, P: int, mode: str) -> None:
    from fairseq_lightseq.sequence_parallel.sharding import SequenceParallel

    sp = SequenceParallel(group, P, dist.get_rank(group), mode) if P > 1 else None
    for m in stacks(model):
        m.sequence_parallel = sp


def _sent():
    from fairseq_lightseq.sequence_parallel.collectives import bytes_sent

    return {"forward": bytes_sent("forward"), "backward": bytes_sent("backward")}


def fake_cell(model, criterion, smp, group, P: int, mode: str) -> dict:
    """Saved bytes and bytes sent of one training forward + backward under FakeTensorMode (the
    parameters stay real; activations are shapes only). The loss is criterion.loss_and_nll (its
    forward's token counts would read values); the dropout seed is a constant (it reads one too)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fairseq_lightseq.ops import dropout_stream
    from fairseq_lightseq.sequence_parallel.collectives import reset_bytes

    _shard(model, group, P, mode)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    next_seed = dropout_stream.next_seed
    dropout_stream.next_seed = lambda: 12345
    t0 = time.perf_counter()
    try:
        reset_bytes()
        with fake:
            with _StorageBytes(list(model.parameters()), fake) as sb:
                # the criterion's own loss path (the fused projection + loss where it applies)
                weight = criterion.projection_weight(model)
                net_output = model(**smp["net_input"], **({"features_only": True} if weight is not None else {}))
                loss = criterion.loss_and_nll(model, net_output, smp, True, weight)[0]
            sb.finish(loss)
            loss.backward()
    finally:
        dropout_stream.next_seed = next_seed
        model.zero_grad(set_to_none=True)
    return {"saved_bytes": sb.bytes, "saved_storages": sb.tensors, "sent": _sent(), "largest": sb.groups(6),
            "seconds": time.perf_counter() - t0}


def real_cell(model, criterion, smp, group, P: int, mode: str, warmup: int, reps: int) -> dict:
    """One forward + backward through the criterion measured (saved bytes, bytes sent, CUDA peak),
    then `warmup` untimed and `reps` timed forward+backward steps (median seconds)."""
    from fairseq_lightseq.sequence_parallel.collectives import reset_bytes

    cuda = smp["target"].is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    _shard(model, group, P, mode)
    model.zero_grad(set_to_none=True)
    static = None
    if cuda:
        sync()
        static = torch.cuda.memory_allocated()  # parameters and the sample, before the step
        torch.cuda.reset_peak_memory_stats()
    reset_bytes()
    torch.manual_seed(2)
    with _StorageBytes(list(model.parameters())) as sb:
        loss, _, _ = criterion(model, smp)
    sb.finish(loss)
    loss.backward()
    sync()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    sent = _sent()
    del loss
    times = []
    for k in range(warmup + reps):
        model.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        loss, _, _ = criterion(model, smp)
        loss.backward()
        sync()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
        del loss
    model.zero_grad(set_to_none=True)
    return {"saved_bytes": sb.bytes, "saved_storages": sb.tensors, "sent": sent, "cuda_peak_bytes": peak,
            "cuda_static_bytes": static, "largest": sb.groups(6), "step_seconds": times,
            "median_seconds": statistics.median(times) if times else None}
