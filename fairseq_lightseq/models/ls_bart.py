"""`ls_bart`: fairseq's BART and mBART (`bart`: BARTModel) with the fused-op encoder and decoder.

fairseq's BARTModel is its TransformerModel (legacy argparse API) with BERT's initialisation
(init_bert_params over the whole model), sentence classification heads (`register_classification_head`,
fed the decoder's state at the last </s> of each row) and its own checkpoint upgrades (heads a checkpoint
brings or lacks, the <mask> row dropped for translation, language rows added for mBART's continued
pretraining). Ours subclasses it and replaces only the encoder and decoder with LSTransformerEncoder and
LSTransformerDecoder (fairseq's TransformerEncoderBase / TransformerDecoderBase modules, so the same keys);
the heads, the hub interface (BARTHubInterface: sample, fill_mask, predict, extract_features) and the
upgrades are fairseq's code. A fairseq `bart`/`mbart` checkpoint loads as it is, and ours loads in a
vanilla fairseq once scripts/convert_checkpoint.py has renamed the recorded model and arch.

Architectures are `ls_<name>` for fairseq's bart_base, bart_large, mbart_base, mbart_large and
mbart_base_wmt20, calling fairseq's arch functions: learned positions, --layernorm-embedding (not in
mbart_base_wmt20), no embedding scale for BART (scaled for mBART), post-LN, GELU, shared embeddings.

BART's forward defaults to return_all_hiddens=True: the encoder then returns a list of every layer's
output [S, B, E] (L + 1 tensors) that nothing in training reads. In training each of them is a tensor that
autograd keeps for backward anyway (the next layer's input, the cross-attention's keys and values), so the
list holds no storage of its own (saved-bytes count at bart_base width: none outside the saved tensors); a
packed forward has no padded states to return. An ls criterion (packed_rows) reads the decoder's features
only, so its forwards run with return_all_hiddens=False, padded or packed; every other caller (fairseq's
criteria, the hub) gets fairseq's default.

Under --ls-packed the ls criteria's forwards run the source and target real tokens as packed rows; a
classification head reads the padded decoder output (its pooling picks each row's last </s> of the source
positions). A batch with a <pad> inside a row (fairseq's denoising draws its random replacement tokens from
every index but <s>) runs padded, where fairseq's masks skip that token, as fairseq's model does.
"""
from fairseq.models import register_model
from fairseq.models.bart import model as fs
from fairseq.models.bart.model import BARTModel
from fairseq.models.transformer import TransformerModel
from torch import nn

from ..errors import ConfigurationError
from ..sequence_parallel import options as sequence_parallel_options
from . import common
from .common import LSModelMixin, check_supported, register_architectures
from .ls_roberta import init_bert_params
from .ls_transformer import LSTransformerModel

NAME = "ls_bart"


def check(args) -> None:
    """Raise ConfigurationError naming the first option of `args` ls_bart does not implement (check_supported's
    refusals, pointing at fairseq's arch of the ls arch asked for: ls_mbart_large -> mbart_large; bart_large
    for a model built in code without an arch)."""
    check_supported(args, NAME, "bart_large")


def check_encoder_decoder_state(state_dict) -> None:
    """ConfigurationError (a refusal: one line, exit 1) when `state_dict` (a checkpoint's "model") is not an
    encoder-decoder model's."""
    keys = list(state_dict)
    if any(k.startswith("encoder.sentence_encoder.") for k in keys):
        held = "an encoder-only model's (RoBERTa: encoder.sentence_encoder.*; --arch roberta / ls_roberta)"
    elif not any(k.startswith("encoder.") for k in keys):
        held = "a decoder-only model's (a language model: decoder.* only; --arch transformer_lm / ls_transformer_lm)"
    elif not all(k in keys for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")):
        held = "not an encoder-decoder model's (no encoder.embed_tokens / decoder.embed_tokens)"
    else:
        return
    raise ConfigurationError(f"{NAME}: the checkpoint's weights are {held}; a BART/mBART checkpoint (--arch "
                             f"bart_*, mbart_*, ls_bart_*, ls_mbart_*) is needed")


@register_model(NAME)
class LSBARTModel(LSModelMixin, BARTModel):
    """fairseq's BARTModel (legacy argparse API) whose encoder and decoder run the fused ops."""

    def __init__(self, args, encoder, decoder):
        # BARTModel.__init__ with our init_bert_params (fairseq's names its own function inside)
        TransformerModel.__init__(self, args, encoder, decoder)
        self.apply(init_bert_params)
        self.classification_heads = nn.ModuleDict()
        if hasattr(self.encoder, "dictionary"):
            self.eos: int = self.encoder.dictionary.eos()

    @classmethod
    def build_model(cls, args, task):
        """fairseq's BARTModel.build_model (TransformerModel's) with our encoder and decoder, the option
        checks first. args: the namespace with the arch function applied, or a checkpoint's config."""
        from fairseq.models.transformer import transformer_legacy

        transformer_legacy.base_architecture(args)
        check(args)
        sequence_parallel_options.check(args)
        model = super().build_model(args, task)
        return common.finish_build(model, NAME, args, task, (model.encoder, model.decoder), model.decoder)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        common.add_args(parser, NAME)

    # ls_transformer's: our encoder and decoder (fairseq's BART builds TransformerModel's)
    build_encoder = classmethod(LSTransformerModel.build_encoder.__func__)
    build_decoder = classmethod(LSTransformerModel.build_decoder.__func__)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, features_only: bool = False,
                classification_head_name=None, token_embeddings=None, return_all_hiddens: bool = True,
                alignment_layer=None, alignment_heads=None, packed_rows: bool = False):
        """fairseq's forward: (decoder output [B, T, V] or features [B, T, E], extra), or a classification
        head's logits [B, C] for classification_head_name. packed_rows: an ls criterion asks for the
        features of the target's real tokens; the forward then keeps no hidden states, and with --ls-packed
        on (common.packings decides) runs the source and target as packed rows ([N, E], their Packing in
        the extra output)."""
        if classification_head_name is not None and classification_head_name not in self.classification_heads:
            known = ", ".join(self.classification_heads) or "none"
            raise ValueError(f"{NAME}: no classification head named {classification_head_name!r} "
                             f"(registered: {known}); register it with register_classification_head or "
                             f"--classification-head-name")
        if packed_rows:
            return_all_hiddens = False  # nothing reads them
        packs = None
        if classification_head_name is None and token_embeddings is None:
            try:
                packs = common.packings(self, (src_tokens.eq(self.encoder.padding_idx),
                                               prev_output_tokens.eq(self.decoder.padding_idx)), packed_rows)
            except ValueError:
                # a <pad> inside a row: fairseq's denoising noise replaces tokens by random indices from 1
                # (<pad>) up, and fairseq's padded forward then skips that token as padding; so does ours
                packs = None
        if packs is None:
            return super().forward(src_tokens, src_lengths, prev_output_tokens, features_only=features_only,
                                   classification_head_name=classification_head_name,
                                   token_embeddings=token_embeddings, return_all_hiddens=return_all_hiddens,
                                   alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        return LSTransformerModel.forward_packed(self, src_tokens, prev_output_tokens, packs)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's load (its upgrades first: heads, the <mask> row, mBART's language rows), after a check that
        `state_dict` is an encoder-decoder's: a refusal naming what it holds instead (a RoBERTa's
        encoder.sentence_encoder.*, a language model's decoder only), where fairseq's BART upgrade would
        stop at a missing key."""
        check_encoder_decoder_state(state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def set_beam_size(self, beam):
        """Nothing to set: fairseq's BART makes its encoder-decoder attention "beamable" here (one copy of
        the encoder output per sentence, the encoder's reorder_encoder_out made a no-op); our cross-attention
        takes the encoder output reordered per hypothesis, as fairseq's transformer gives it."""


# Architectures: ls_<name> has exactly the defaults of fairseq's <name> (its own function is called).
ARCHITECTURES = {
    "ls_bart_base": fs.bart_base_architecture,
    "ls_bart_large": fs.bart_large_architecture,
    "ls_mbart_base": fs.mbart_base_architecture,
    "ls_mbart_large": fs.mbart_large_architecture,
    "ls_mbart_base_wmt20": fs.mbart_base_wmt20_architecture,
}

globals().update(register_architectures(NAME, ARCHITECTURES))
