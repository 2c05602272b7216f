"""`ls_roberta`: fairseq's encoder-only RoBERTa (masked_lm pretraining, sentence_prediction fine-tuning)
with the fused-op encoder.

fairseq's RobertaModel holds a RobertaEncoder, which holds a TransformerEncoder as `sentence_encoder`,
the masked-LM head `lm_head` and, in the model, the `classification_heads`. Ours subclasses all of it
and replaces only what computes: the sentence encoder is our LSTransformerEncoder (fairseq's
TransformerEncoderBase modules, so the same keys), the LM head is LSRobertaLMHead (fairseq's
RobertaLMHead parameters). The state_dict (`encoder.sentence_encoder.*`, `encoder.lm_head.*`,
`classification_heads.*`) and fairseq's key upgrades (decoder -> encoder, emb_layer_norm ->
layernorm_embedding, the heads a checkpoint brings) are fairseq's, so checkpoints interchange
(scripts/convert_checkpoint.py rewrites the recorded names only) and the hub interface
(`from_pretrained`, RobertaHubInterface) is fairseq's own. The classification heads are fairseq's
modules (a dense layer and a projection of the <s> features: nothing to fuse).

Architectures are `ls_<name>` for fairseq's roberta, roberta_base, roberta_large, roberta_prenorm and
xlm, calling fairseq's arch functions: learned positions (max_positions + pad + 1 rows),
--layernorm-embedding, --no-scale-embedding, post-LN or pre-LN, gelu, init_bert_params.

Sequence parallelism (--sequence-parallel-size P): the encoder runs this rank's rows of the padded
time axis (bidirectional attention over all rows, either exchange mode), the features it returns are
those rows, with the shard in the extra output, from which ls_masked_lm takes its target columns and
counts its share. sentence_prediction is refused with P > 1: its heads read row 0, which one rank
holds, and it counts every sentence on every rank.
"""
from fairseq.models import FairseqEncoderModel, register_model
from fairseq.models.roberta import model as fs
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.modules import transformer_sentence_encoder
from fairseq.utils import safe_getattr, safe_hasattr
from torch import nn

from ..errors import ConfigurationError
from ..modules.lm_head import LSRobertaLMHead
from ..modules import packing
from ..modules.multihead_attention import LSMultiheadAttention
from ..modules.transformer import LSTransformerEncoder
from ..sequence_parallel import options as sequence_parallel_options
from ..sequence_parallel.sharding import EXTRA_KEY, shard_or_none
from . import common
from .common import LSModelMixin, check_supported, register_architectures

NAME = "ls_roberta"
# The criteria that count a rank's share under sequence parallelism (sentence_prediction does not).
SEQUENCE_PARALLEL_CRITERIA = ("ls_masked_lm",)


def check(args) -> None:
    """Raise ConfigurationError naming the first option of `args` ls_roberta does not implement: the common
    refusals (check_supported) and fairseq's structured pruning, which calls methods of fairseq's
    attention and FFN modules (_prune_attention_heads, _prune_fc_layer) that our layers do not have."""
    check_supported(args, NAME, "roberta")
    asked, native = common.arch_names(args, NAME, "roberta")
    for option, off in (("mha_heads_to_keep", -1), ("ffn_blocks_to_remove", -1)):
        value = safe_getattr(args, option, off)
        if value != off:
            raise ConfigurationError(f"{asked} does not support --{option.replace('_', '-')} {value}; "
                                     f"use --arch {native} for it")


def init_bert_params(module: nn.Module) -> None:
    """fairseq's init_bert_params (for `module.apply`), which draws the q, k, v weights of each of
    fairseq's MultiheadAttention once more after its projections: ours too, in the same order and from
    the same CPU generator, so the same seed gives fairseq's initial weights."""
    transformer_sentence_encoder.init_bert_params(module)
    if isinstance(module, LSMultiheadAttention):
        for proj in (module.q_proj, module.k_proj, module.v_proj):
            w = proj.weight.data
            w.copy_(w.cpu().normal_(mean=0.0, std=0.02).to(w.device))


class LSRobertaEncoder(RobertaEncoder):
    """fairseq's RobertaEncoder with our sentence encoder and LM head."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = LSTransformerEncoder(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder

    def build_lm_head(self, embed_dim, output_dim, activation_fn, weight):
        return LSRobertaLMHead(embed_dim, output_dim, activation_fn, weight)

    def extract_features(self, src_tokens, return_all_hiddens=False, **kwargs):
        """fairseq's (features [B, T, E], {"inner_states": ...}); under sequence parallelism the features
        are this rank's rows of the padded time axis and the extra output holds the shard."""
        features, extra = super().extract_features(src_tokens, return_all_hiddens=return_all_hiddens, **kwargs)
        shard = shard_or_none(self.sentence_encoder.sequence_parallel, src_tokens.size(1))
        if shard is not None:
            extra[EXTRA_KEY] = shard
        return features, extra


@register_model(NAME)
class LSRobertaModel(LSModelMixin, RobertaModel):
    """fairseq's RobertaModel (legacy argparse API) whose encoder and LM head run the fused ops."""

    def __init__(self, args, encoder):
        # RobertaModel.__init__ with our init_bert_params (fairseq's names its own function inside)
        FairseqEncoderModel.__init__(self, encoder)
        self.args = args
        self.apply(init_bert_params)
        self.classification_heads = nn.ModuleDict()

    def forward(self, src_tokens, features_only: bool = False, return_all_hiddens: bool = False,
                classification_head_name=None, packed_rows: bool = False, **kwargs):
        """fairseq's forward. With --ls-packed on (common.packings decides) the sentence encoder runs the
        batch's real tokens as packed rows where the caller reads only real rows: a classification head
        reads each sentence's position-0 row (fairseq's RobertaClassificationHead reads features[:, 0]
        only), the LM head the masked tokens' rows, and packed_rows (an ls criterion) returns the rows [N, E]
        with their Packing in the extra output. Everything else, return_all_hiddens, other head classes and a
        head over a batch whose rows do not all start at position 0 run padded."""
        head = self.classification_heads[classification_head_name] if classification_head_name is not None else None
        masked_tokens = kwargs.get("masked_tokens")
        masked_logits = masked_tokens is not None and not features_only
        packs = None
        if not return_all_hiddens and (head is None or type(head) is fs.RobertaClassificationHead):
            padding_mask = src_tokens.eq(self.encoder.sentence_encoder.padding_idx)
            packs = common.packings(self, (padding_mask,), packed_rows or head is not None or masked_logits)
        if packs is not None and head is not None and packs[0].first_rows() is None:
            packs = None  # a left-padded row: position 0 is padding, which the head reads in the padded run
        if packs is None:
            return super().forward(src_tokens, features_only, return_all_hiddens, classification_head_name, **kwargs)
        pack = packs[0]
        x = self.encoder.sentence_encoder.forward_packed(src_tokens, pack)
        extra = {"inner_states": []}
        if head is not None:
            return head(x.index_select(0, pack.first_rows()).unsqueeze(1)), extra
        if masked_logits:
            return self.encoder.lm_head(x, masked_tokens=pack.gather(masked_tokens)), extra
        extra[packing.EXTRA_KEY] = pack
        return x, extra

    @classmethod
    def add_args(cls, parser):
        RobertaModel.add_args(parser)
        common.add_args(parser, NAME)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's RobertaModel.build_model with LSRobertaEncoder (it names its encoder class inside),
        the option checks first. args: the whole namespace (a legacy model), or a checkpoint's config."""
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        fs.base_architecture(args)
        check(args)
        sequence_parallel_options.check(args, sides=("encoder",), criteria=SEQUENCE_PARALLEL_CRITERIA)
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        encoder = LSRobertaEncoder(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        model = cls(args, encoder)
        return common.finish_build(model, NAME, args, task, (model.encoder.sentence_encoder,))


# Architectures: ls_<name> has exactly the defaults of fairseq's <name> (its own function is called).
ARCHITECTURES = {
    "ls_roberta": fs.base_architecture,
    "ls_roberta_base": fs.roberta_base_architecture,
    "ls_roberta_large": fs.roberta_large_architecture,
    "ls_roberta_prenorm": fs.roberta_prenorm_architecture,
    "ls_xlm": fs.xlm_architecture,
}

globals().update(register_architectures(NAME, ARCHITECTURES))
