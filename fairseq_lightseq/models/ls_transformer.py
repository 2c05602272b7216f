"""`ls_transformer`: fairseq's transformer with the fused-op encoder and decoder.

Same command-line arguments, architectures (`ls_<fairseq arch name>`, using fairseq's own arch
functions, hence the same defaults) and state_dict as fairseq's `transformer`, so checkpoints
interchange (scripts/convert_checkpoint.py only rewrites the recorded names: model/arch, and the
criterion and optimizer when those are switched too).
"""
from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer import transformer_legacy as fs

from ..modules.transformer import LSTransformerDecoder, LSTransformerEncoder
from ..sequence_parallel import options as sequence_parallel_options
from . import common
from .common import LSModelMixin, check_supported, register_architectures

NAME = "ls_transformer"


@register_model(NAME)
class LSTransformerModel(LSModelMixin, TransformerModel):
    """fairseq's TransformerModel (legacy argparse API) whose encoder and decoder run the fused ops."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        common.add_args(parser, NAME)

    @classmethod
    def build_model(cls, args, task):
        fs.base_architecture(args)
        check_supported(args, NAME, "transformer")
        sequence_parallel_options.check(args)
        model = super().build_model(args, task)
        return common.finish_build(model, NAME, args, task, (model.encoder, model.decoder), model.decoder)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None, packed_rows: bool = False):
        """fairseq's forward. packed_rows: an ls criterion asks for the features of the target's real tokens as
        packed rows ([N, E], their Packing in the extra output); with --ls-packed on (common.packings decides)
        the encoder and decoder then run packed rows, the source and the target each packed once here."""
        packs = common.packings(self, (src_tokens.eq(self.encoder.padding_idx),
                                       prev_output_tokens.eq(self.decoder.padding_idx)), packed_rows)
        if packs is None:
            return super().forward(src_tokens, src_lengths, prev_output_tokens, return_all_hiddens=return_all_hiddens,
                                   features_only=features_only, alignment_layer=alignment_layer,
                                   alignment_heads=alignment_heads)
        return self.forward_packed(src_tokens, prev_output_tokens, packs)

    def forward_packed(self, src_tokens, prev_output_tokens, packs):
        """The packed forward of an encoder-decoder model (ls_transformer, ls_bart): src_tokens [B, S] and
        prev_output_tokens [B, T] with their Packings `packs` (source, target). Returns the decoder's packed
        output ([N, E] features, the target's Packing in the extra output)."""
        source, target = packs
        encoder_rows = self.encoder.forward_packed(src_tokens, source)
        x = self.decoder.forward_packed(prev_output_tokens, target, encoder_rows, source)
        return self.decoder.packed_output(x, target)

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


globals().update(register_architectures(NAME, ARCHITECTURES))
