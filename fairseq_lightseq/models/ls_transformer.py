"""`ls_transformer`: fairseq's transformer with the fused-op encoder and decoder.

Same command-line arguments, architectures (`ls_<fairseq arch name>`, using fairseq's own arch
functions, hence the same defaults) and state_dict as fairseq's `transformer`, so checkpoints
interchange (scripts/convert_checkpoint.py only rewrites the recorded names: model/arch, and the
criterion and optimizer when those are switched too).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer import transformer_legacy as fs
from torch import nn

from ..modules.transformer import LSTransformerDecoder, LSTransformerEncoder
from ..sequence_parallel import options as sequence_parallel_options
from ..modules.transformer_layer import FAIRSEQ_ACTIVATIONS


# Dropout probabilities the layers take; each must be in [0, 1] (checked at build, not by the first
# forward's op). --relu-dropout is fairseq's old name for --activation-dropout.
DROPOUT_OPTIONS = ("dropout", "attention_dropout", "activation_dropout", "relu_dropout")


def check_supported(args) -> None:
    """Raise ValueError naming the first fairseq option ls_transformer does not implement, or whose
    value is out of range."""
    def get(name, default=None):
        return getattr(args, name, default)

    for name in DROPOUT_OPTIONS:
        p = get(name)
        if p is not None and not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"ls_transformer: --{name.replace('_', '-')} must be in [0, 1], got {p}")

    unsupported = [
        ("--adaptive-softmax-cutoff", get("adaptive_softmax_cutoff") is not None),
        ("--adaptive-input", bool(get("adaptive_input"))),
        ("--tie-adaptive-weights", bool(get("tie_adaptive_weights"))),
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
            raise ValueError(f"ls_transformer does not support {option}; use --arch transformer for it")
    act = str(get("activation_fn", "relu"))
    if act not in FAIRSEQ_ACTIVATIONS:
        raise ValueError(f"ls_transformer does not support --activation-fn {act}; "
                         f"supported: {', '.join(FAIRSEQ_ACTIVATIONS)}")


@register_model("ls_transformer")
class LSTransformerModel(TransformerModel):
    """fairseq's TransformerModel (legacy argparse API) whose encoder and decoder run the fused ops."""

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        sequence_parallel_options.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        fs.base_architecture(args)
        check_supported(args)
        sequence_parallel_options.check(args)
        model = super().build_model(args, task)
        sp = sequence_parallel_options.setup(args, task)
        model.encoder.sequence_parallel = model.decoder.sequence_parallel = sp
        return model

    def train(self, mode: bool = True):
        """nn.Module.train over the whole tree without its per-module cost: fairseq's Trainer and task call
        model.train() on every step, and nn.Module's recursion (named_children generators and
        Module.__setattr__ for each of the ~200 submodules at Transformer-big depth) takes ~0.4 ms of host
        time a call. This walk sets the same `training` flag of every submodule directly; a submodule
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

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return LSTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return LSTransformerDecoder(cfg, tgt_dict, embed_tokens,
                                    no_encoder_attn=getattr(cfg, "no_cross_attention", False))


# Architectures: ls_<name> has exactly the defaults of fairseq's <name> (its own function is called).
ARCHITECTURES = {
    "ls_transformer": fs.base_architecture,
    "ls_transformer_tiny": fs.tiny_architecture,
    "ls_transformer_iwslt_de_en": fs.transformer_iwslt_de_en,
    "ls_transformer_wmt_en_de": fs.transformer_wmt_en_de,
    "ls_transformer_vaswani_wmt_en_de_big": fs.transformer_vaswani_wmt_en_de_big,
    "ls_transformer_vaswani_wmt_en_fr_big": fs.transformer_vaswani_wmt_en_fr_big,
    "ls_transformer_wmt_en_de_big": fs.transformer_wmt_en_de_big,
    "ls_transformer_wmt_en_de_big_t2t": fs.transformer_wmt_en_de_big_t2t,
}


def _register(arch_name, fairseq_fn):
    def arch(args):
        fairseq_fn(args)
    arch.__name__ = arch_name
    arch.__doc__ = f"The defaults of fairseq's {fairseq_fn.__name__} ({arch_name[3:]})."
    register_model_architecture("ls_transformer", arch_name)(arch)
    return arch


for _name, _fn in ARCHITECTURES.items():
    globals()[_name] = _register(_name, _fn)
