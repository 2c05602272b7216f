"""`ls_transformer_lm`: fairseq's decoder-only transformer_lm with the fused-op decoder.

fairseq's TransformerLanguageModel is a TransformerDecoder without cross-attention; ours is our
LSTransformerDecoder with no_encoder_attn=True, so the state_dict (decoder.embed_tokens, .layers.N.*,
.layer_norm, .output_projection, ...) is fairseq's and checkpoints interchange
(scripts/convert_checkpoint.py rewrites only the recorded names). Architectures are `ls_<name>` for
each fairseq `transformer_lm*` arch our layers run, calling fairseq's own arch function (same defaults).

Registered as a legacy (argparse) model with fairseq's TransformerLanguageModelConfig as its
arguments, unlike fairseq's dataclass-registered transformer_lm: fairseq then hands build_model the
whole namespace, so the options that cannot combine with sequence parallelism (--criterion,
--ddp-backend, the number of processes) are refused at build, as for ls_transformer. A native
checkpoint converted to ours (cfg.model a DictConfig) and ours converted to native (a Namespace)
both load: fairseq's build_model takes either form for either model.

fairseq's plain `--arch transformer_lm` has no arch function: its defaults are its dataclass's (post-LN,
unlike every named transformer_lm_* arch, whose base_lm_architecture forces pre-LN); ls_transformer_lm
sets exactly those (transformer_lm_defaults).
"""
import dataclasses

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models import transformer_lm as fs
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from ..modules.transformer import LSTransformerDecoder
from ..sequence_parallel import options as sequence_parallel_options
from . import common
from .common import LSModelMixin, check_supported, register_architectures

NAME = "ls_transformer_lm"


@register_model(NAME)
class LSTransformerLanguageModel(LSModelMixin, TransformerLanguageModel):
    """fairseq's TransformerLanguageModel whose decoder runs the fused ops."""

    @classmethod
    def add_args(cls, parser):
        # fairseq's transformer_lm arguments without defaults (the arch functions set them)
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        common.add_args(parser, NAME)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's TransformerLanguageModel.build_model for the plain token embedding (the
        character and adaptive inputs are refused by check_supported), with our decoder. args: the
        namespace (or a checkpoint's model config) with the arch function applied."""
        # fairseq builds its transformer_lm from TransformerLanguageModelConfig, whose defaults fill every
        # option the arch function left unset (activation_dropout in every named arch); so does ours
        transformer_lm_defaults(args)
        check_supported(args, NAME, "transformer_lm")
        sequence_parallel_options.check(args, sides=("decoder",))
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", fs.DEFAULT_MAX_TARGET_POSITIONS)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        decoder = LSTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True)
        return common.finish_build(cls(decoder), NAME, args, task, (decoder,), decoder)

    def forward(self, src_tokens, packed_rows: bool = False, **kwargs):
        """fairseq's forward (the decoder's). packed_rows: an ls criterion asks for the features of the real
        tokens as packed rows ([N, E], their Packing in the extra output); with --ls-packed on
        (common.packings decides) the decoder then runs the packed rows. Incremental decoding and
        return_all_hiddens run padded."""
        packs = None
        if kwargs.get("incremental_state") is None and not kwargs.get("return_all_hiddens", False):
            packs = common.packings(self, (src_tokens.eq(self.decoder.padding_idx),), packed_rows)
        if packs is None:
            return super().forward(src_tokens, **kwargs)
        x = self.decoder.forward_packed(src_tokens, packs[0])
        return self.decoder.packed_output(x, packs[0])


def transformer_lm_defaults(args):
    """TransformerLanguageModelConfig's defaults for every field of `args` not set: the defaults of
    fairseq's plain --arch transformer_lm, and what fairseq's conversion of the namespace to its model
    config gives the fields a named arch function leaves unset (the interpolated ones,
    ${task.tokens_per_sample} and such, come from the task's options)."""
    for f in dataclasses.fields(TransformerLanguageModelConfig):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if f.name.startswith("_") or (isinstance(default, str) and default.startswith("${")):
            continue
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, default)


# fairseq's transformer_lm architectures that our layers run. Not here: transformer_lm_wiki103 and
# transformer_lm_baevski_wiki103 (adaptive input and softmax, refused at build).
ARCHITECTURES = {
    "ls_transformer_lm": transformer_lm_defaults,
    "ls_transformer_lm_big": fs.transformer_lm_big,
    "ls_transformer_lm_gbw": fs.transformer_lm_baevski_gbw,
    "ls_transformer_lm_baevski_gbw": fs.transformer_lm_baevski_gbw,
    "ls_transformer_lm_gpt": fs.transformer_lm_gpt,
    "ls_transformer_lm_gpt2_tiny": fs.transformer_lm_gpt2_tiny,
    "ls_transformer_lm_gpt2_small": fs.transformer_lm_gpt2_small,
    "ls_transformer_lm_gpt2_medium": fs.transformer_lm_gpt2_medium,
    "ls_transformer_lm_gpt2_big": fs.transformer_lm_gpt2_big,
    "ls_transformer_lm_gpt2_big_wide": fs.transformer_lm_gpt2_big_wide,
    "ls_transformer_lm_gpt2_bigger": fs.transformer_lm_gpt2_bigger,
    "ls_transformer_lm_gpt3_small": fs.transformer_lm_gpt3_small,
    "ls_transformer_lm_gpt3_medium": fs.transformer_lm_gpt3_medium,
    "ls_transformer_lm_gpt3_large": fs.transformer_lm_gpt3_large,
    "ls_transformer_lm_gpt3_xl": fs.transformer_lm_gpt3_xl,
    "ls_transformer_lm_gpt3_2_7": fs.transformer_lm_gpt3_2_7,
    "ls_transformer_lm_gpt3_6_7": fs.transformer_lm_gpt3_6_7,
    "ls_transformer_lm_gpt3_13": fs.transformer_lm_gpt3_13,
    "ls_transformer_lm_gpt3_175": fs.transformer_lm_gpt3_175,
}

globals().update(register_architectures(NAME, ARCHITECTURES))
