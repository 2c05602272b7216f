"""What every ls_* model shares: the refusal of fairseq options our layers do not implement, the
options they add to fairseq's (`add_args`: sequence parallelism, --ls-recompute-attention,
--ls-attention, --ls-packed), the end of their build_model (`finish_build`: sequence parallelism set up,
the padding side of the decoder's rows, the recompute default, the attention mode, packing), whether a
forward runs packed (`packings`), and a cheap model.train()."""
import argparse

import torch
from torch import nn

from ..errors import ConfigurationError
from ..modules import packing
from ..modules.multihead_attention import ATTENTION_MODES, LSMultiheadAttention
from ..modules.transformer_layer import TransformerLayerBase, ops_activation
from ..sequence_parallel import options as sequence_parallel_options

# --ls-recompute-attention's default per model. Recomputing q, k, v in backward trades one more QKV
# GEMM per attention for about 3 [T, B, E] tensors less kept per attention. Translation's rows are
# short, so the kept projections are a large share of what a layer keeps and the GEMM is cheap: on.
# The LM and RoBERTa run long rows, where the attention's other saved tensors dominate and the extra
# GEMM is a larger share of the step: off. The measurements behind the choice are in the benchmark
# results, not here.
RECOMPUTE_DEFAULTS = {"ls_transformer": True, "ls_transformer_lm": False, "ls_roberta": False}

# --ls-packed's default per model: packed rows where the benchmark on real batches shows them faster than
# the padded path without keeping more for backward. RoBERTa's sentence-classification batches are
# shuffled, so much of them is padding: on. fairseq sorts translation sentences by length before batching,
# but a batch of hundreds of sentences still pads its targets, more so at larger --max-tokens, and the packed
# one-node blocks keep less than the padded ones: on. The LM's sorted one-sentence rows carry almost no
# padding, so packing only adds its own cost: off. The figures are in the benchmark results, not here.
PACKED_DEFAULTS = {"ls_transformer": True, "ls_transformer_lm": False, "ls_roberta": True}

# ls_bart (BART, mBART) is the translation model with other heads and tasks: its rows, and so its defaults,
# are ls_transformer's.
RECOMPUTE_DEFAULTS["ls_bart"] = RECOMPUTE_DEFAULTS["ls_transformer"]
PACKED_DEFAULTS["ls_bart"] = PACKED_DEFAULTS["ls_transformer"]

# Dropout probabilities the layers take; each must be in [0, 1] (checked at build, not by the first
# forward's op). --relu-dropout is fairseq's old name for --activation-dropout.
DROPOUT_OPTIONS = ("dropout", "attention_dropout", "activation_dropout", "relu_dropout")


def arch_names(args, model: str, native: str):
    """(the ls arch `args` asks for, fairseq's arch of the same name without ls_: e.g. ls_mbart_large,
    mbart_large), the names a refusal gives. Without an ls arch of fairseq's registry in `args` (a model built
    in code, not by fairseq-train): (`model`, our registered model, and `native`, fairseq's arch for it)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = getattr(args, "arch", None)
    if isinstance(arch, str) and arch.startswith("ls_") and arch[3:] in ARCH_MODEL_REGISTRY:
        return arch, arch[3:]
    return model, native


def check_supported(args, model: str, native: str) -> None:
    """Raise ConfigurationError naming the first fairseq option `model` does not implement, or whose value is
    out of range; the message names the ls arch asked for and points at fairseq's arch of the same name
    (arch_names; `native`, a registered fairseq arch, where `args` names none). args: an argparse Namespace or
    a model config (DictConfig) of either family."""
    def get(name, default=None):
        return getattr(args, name, default)

    asked, native = arch_names(args, model, native)

    for name in DROPOUT_OPTIONS:
        p = get(name)
        if p is not None and not 0.0 <= float(p) <= 1.0:
            raise ConfigurationError(f"{model}: --{name.replace('_', '-')} must be in [0, 1], got {p}")

    unsupported = [
        ("--adaptive-softmax-cutoff", get("adaptive_softmax_cutoff") is not None),
        ("--adaptive-input", bool(get("adaptive_input"))),
        ("--tie-adaptive-weights", bool(get("tie_adaptive_weights"))),
        ("--character-embeddings", bool(get("character_embeddings"))),
        ("--quant-noise-pq", (get("quant_noise_pq") or 0) > 0),
        ("--quant-noise-scalar", (get("quant_noise_scalar") or 0) > 0),
        ("--encoder-layerdrop", (get("encoder_layerdrop") or 0) > 0),
        ("--decoder-layerdrop", (get("decoder_layerdrop") or 0) > 0),
        ("--cross-self-attention", bool(get("cross_self_attention"))),
        ("--base-layers", (get("base_layers") or 0) > 0),
        ("--encoder-xformers-att-config", get("encoder_xformers_att_config") is not None),
        ("--decoder-xformers-att-config", get("decoder_xformers_att_config") is not None),
        ("--scale-attn/--scale-fc/--scale-heads/--scale-resids (normformer)",
         any(bool(get(n)) for n in ("scale_attn", "scale_fc", "scale_heads", "scale_resids"))),
        ("--alignment-heads/--alignment-layer (transformer_align)",
         get("alignment_heads") is not None or get("alignment_layer") is not None),
    ]
    for option, bad in unsupported:
        if bad:
            raise ConfigurationError(f"{asked} does not support {option}; use --arch {native} for it")
    ops_activation(str(get("activation_fn", "relu")), asked)
    packed_option(args, model)


def right_padded_targets(task) -> bool:
    """Whether `task`'s batches give the decoder right-padded rows (each row its real tokens, then only
    padding), as LSTransformerDecoder.right_padded wants to know; False where that is not known.

    - fairseq's language_modeling task (and its subclasses): MonolingualDataset collates with
      left_pad=False, LMContextWindowDataset (fairseq-eval-lm --context-window) appends its padding after
      the row, and build_dataset_for_inference pads with left_pad=False;
    - fairseq's translation task (and its subclasses, which load LanguagePairDataset with the task's own
      option): prev_output_tokens are padded on the left only with --left-pad-target True;
    - anything else (other tasks, a decoder built without a task): unknown, the mask is kept."""
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from fairseq.tasks.translation import TranslationTask

    if isinstance(task, LanguageModelingTask):
        return True
    if isinstance(task, TranslationTask):
        return not bool(getattr(task.cfg, "left_pad_target", True))
    return False


def add_args(parser, model: str) -> None:
    """The options every ls_* model adds to its fairseq base's: sequence parallelism,
    --ls-recompute-attention (default RECOMPUTE_DEFAULTS[model]) and --ls-attention."""
    sequence_parallel_options.add_args(parser)
    add_recompute_args(parser, RECOMPUTE_DEFAULTS[model])
    parser.add_argument("--ls-attention", choices=ATTENTION_MODES, metavar="MODE",
                        help="which attention runs, on padded and packed batches alike: explicit (our kernels "
                             "everywhere; every attention-dropout mask from our Philox stream), sdpa or flash "
                             "(torch's fused kernels everywhere: SDPA on padded rows, its flash varlen kernel on "
                             "packed rows; their dropout draws from torch's generator; on the CPU, which has no "
                             "such kernel for packed rows, sdpa turns --ls-packed's default off), or auto (torch's "
                             "kernels on CUDA where they apply; on the CPU ours, SDPA for long rows without "
                             "attention dropout) (default: auto)")
    parser.add_argument("--ls-packed", type=boolean, metavar="BOOL",
                        help="training and validation forwards run on the batch's real tokens only: every layer "
                             "computes packed rows instead of padded ones, with the padded run's dropout masks "
                             "(the padded path serves generation, scoring and the hub) "
                             f"(default: {PACKED_DEFAULTS[model]}, False with --sequence-parallel-size > 1)")


# The words a BOOL option takes, in any case: fairseq's own spelling (True/False) and the usual ones.
BOOLEAN_WORDS = {"true": True, "yes": True, "on": True, "1": True,
                 "false": False, "no": False, "off": False, "0": False}


def boolean(value: str) -> bool:
    """The `type` of every --ls-* BOOL option: a word of BOOLEAN_WORDS (any case) as a bool. Anything else is
    an argparse error naming the option (exit status 2). The value is only looked up, never evaluated
    (fairseq's eval_bool runs its argument as Python)."""
    found = BOOLEAN_WORDS.get(str(value).strip().lower())
    if found is None:
        raise argparse.ArgumentTypeError(f"expected a boolean (True/False, yes/no, on/off, 1/0), got {value!r}")
    return found


def finish_build(model: nn.Module, name: str, args, task, sequence_parallel=(), decoder=None) -> nn.Module:
    """The end of every ls_* build_model: the sequence-parallel setup of `args` given to each module of
    `sequence_parallel` (the encoder and decoder that shard their rows), whether `decoder`'s rows are
    right-padded (from the task, None for an encoder-only model), every layer's recompute_attention
    (RECOMPUTE_DEFAULTS[name] where args has none) and every attention's mode (--ls-attention).
    Returns `model`."""
    packed = packed_option(args, name)
    sp = sequence_parallel_options.setup(args, task)
    for module in sequence_parallel:
        module.sequence_parallel = sp
    if decoder is not None:
        decoder.right_padded = right_padded_targets(task)
    set_recompute_attention(model, args, RECOMPUTE_DEFAULTS[name])
    mode = getattr(args, "ls_attention", None)
    if mode is not None:  # else LSMultiheadAttention's default, "auto"
        set_attention_mode(model, mode)
    model.ls_packed = packed
    return model


def packed_option(args, name: str) -> bool:
    """--ls-packed's value: as given, else PACKED_DEFAULTS[name] (also for an older checkpoint's config
    without the option), except with sequence parallelism, whose shards are padded rows, and with
    --ls-attention sdpa on the CPU, where torch has no fused attention for packed rows (sdpa asks for torch's
    kernels on every batch): there the default is off, and an explicit --ls-packed True is refused
    (ConfigurationError naming both options)."""
    value = getattr(args, "ls_packed", None)
    size, _ = sequence_parallel_options.size_and_mode(args)
    sdpa_on_cpu = getattr(args, "ls_attention", None) == "sdpa" and on_cpu(args)
    if value is None:
        return PACKED_DEFAULTS[name] and size == 1 and not sdpa_on_cpu
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}: --ls-packed must be a boolean (True or False), got {value!r}")
    if value and size > 1:
        raise ConfigurationError(f"{name}: --ls-packed True does not combine with --sequence-parallel-size {size} "
                                 "(sequence parallelism shards padded rows); use --ls-packed False")
    if value and sdpa_on_cpu:
        raise ConfigurationError(f"{name}: --ls-packed True does not combine with --ls-attention sdpa on the CPU "
                                 "(torch has no fused attention for packed rows there); use --ls-packed False to "
                                 "run SDPA on padded batches, or --ls-attention auto or explicit to run packed rows "
                                 "on our kernel")
    return value


def on_cpu(args) -> bool:
    """Whether the run trains on the CPU: fairseq's --cpu, or no CUDA device."""
    return bool(getattr(args, "cpu", False)) or not torch.cuda.is_available()


def packings(model: nn.Module, padding_masks, requested: bool):
    """The Packings (modules.packing) of a forward's padded sides, or None when it runs padded. padding_masks:
    [B, T] bool masks (True at padding), one per side (translation: source, then target). Packed when the
    model has --ls-packed on, the caller reads only real rows (`requested`: an ls criterion asking for packed
    rows, a RoBERTa classification or masked-LM head), and some side has padding (a batch without any gives
    the padded path's numbers by running it). Every other forward returns fairseq's [B, T, ...] outputs
    from the padded path: generation, scoring, the hub, fairseq's own translation and LM criteria."""
    if not getattr(model, "ls_packed", False) or not requested:
        return None
    packs = tuple(packing.pack(mask) for mask in padding_masks)
    return packs if any(p.has_padding for p in packs) else None


def set_attention_mode(model: nn.Module, mode: str) -> None:
    """Sets every attention module's attention_mode (one of ATTENTION_MODES; ConfigurationError otherwise)."""
    if mode not in ATTENTION_MODES:
        raise ConfigurationError(f"--ls-attention must be one of {', '.join(ATTENTION_MODES)}, got {mode!r}")
    for m in model.modules():
        if isinstance(m, LSMultiheadAttention):
            m.attention_mode = mode


def add_recompute_args(parser, default: bool) -> None:
    """--ls-recompute-attention BOOL, whose default (`default`) is the model's."""
    parser.add_argument("--ls-recompute-attention", type=boolean, metavar="BOOL",
                        help="the attention blocks project q, k, v again in backward (and rerun SDPA's forward "
                             "without attention dropout) instead of keeping them for backward: about 3 [T, B, E] "
                             f"tensors less per attention for one more QKV GEMM per step (default: {default})")


def set_recompute_attention(model: nn.Module, args, default: bool) -> None:
    """Sets every layer's recompute_attention from --ls-recompute-attention, or `default` where the
    namespace (an older checkpoint's config) has no value."""
    value = getattr(args, "ls_recompute_attention", None)
    value = default if value is None else bool(value)
    for m in model.modules():
        if isinstance(m, TransformerLayerBase):
            m.recompute_attention = value


class LSModelMixin:
    """What every ls_* model class adds to its fairseq base class: no downloadable hub models (fairseq's
    names point at fairseq's own checkpoints), and model.train() without nn.Module's per-module cost."""

    @classmethod
    def hub_models(cls):
        return {}

    def train(self, mode: bool = True):
        """nn.Module.train over the whole tree without its per-module cost: fairseq's Trainer and task call
        model.train() on every step, and nn.Module's recursion (named_children generators and
        Module.__setattr__ for each of the ~200 submodules at Transformer-big depth) is a noticeable share
        of a step's host time. This walk sets the same `training` flag of every submodule directly; a submodule
        class that overrides train() gets its own train(mode) called, as nn.Module would."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        stack = [self]
        while stack:
            m = stack.pop()
            if m is not self and type(m).train is not nn.Module.train:
                m.train(mode)
                continue
            m.__dict__["training"] = mode
            stack.extend(c for c in m._modules.values() if c is not None)
        return self


def register_architectures(model_name: str, architectures: dict) -> dict:
    """Registers ls_<name> -> fairseq's arch function <name> for `model_name`; returns {ls name: our
    function}. ls_<name> has exactly the defaults of fairseq's <name> (its own function is called)."""
    from fairseq.models import register_model_architecture

    registered = {}
    for arch_name, fairseq_fn in architectures.items():
        def arch(args, fairseq_fn=fairseq_fn):
            fairseq_fn(args)
        arch.__name__ = arch_name
        arch.__doc__ = f"The defaults of fairseq's {fairseq_fn.__name__} ({arch_name[3:]})."
        register_model_architecture(model_name, arch_name)(arch)
        registered[arch_name] = arch
    return registered
