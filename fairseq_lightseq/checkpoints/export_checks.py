"""What `python -m fairseq_lightseq.export_ctranslate2` checks before it calls CTranslate2's converter, so
that a wrong data-bin, language pair or option ends in one line that names it. Unchecked, the converter
ends in a traceback (fairseq's "Could not infer language pair", torch's "size mismatch" from
load_state_dict, an AttributeError on a module the model does not have) or, for a few options, writes a
model that computes something else (it drops the parameters it does not know).

Each check reads the converter's view of the model: `args`, the argparse Namespace that fairseq's
`tasks.setup_task` and `models.build_model` get from it (task and model options together), and the
checkpoint's state_dict.
"""
import argparse
import os
from typing import Dict, Optional, Tuple

from fairseq.data import Dictionary, data_utils


class ExportError(ValueError):
    """The checkpoint, data-bin or output directory cannot be exported as asked; the message says why."""


TRAINED_ON = "pass the data-bin the model was trained on"


def _dictionaries(data_bin: str) -> str:
    """The dict*.txt files of `data_bin`, for a message."""
    found = sorted(f for f in os.listdir(data_bin) if f.startswith("dict") and f.endswith(".txt"))
    return ", ".join(found) if found else "none"


def _pairs(data_bin: str) -> set:
    """The language pairs `data_bin`'s binarised files are named by (<split>.<src>-<tgt>.<lang>.idx,
    fairseq's data_utils.infer_language_pair rule), as (src, tgt) tuples."""
    pairs = set()
    for name in os.listdir(data_bin):
        parts = name.split(".")
        if len(parts) >= 3 and len(parts[1].split("-")) == 2:
            pairs.add(tuple(parts[1].split("-")))
    return pairs


def _dictionary_size(data_bin: str, name: str) -> int:
    return len(Dictionary.load(os.path.join(data_bin, name)))


def _rows(model: dict, *keys) -> Optional[int]:
    """The number of rows (vocabulary entries) of the first of `keys` the state_dict holds."""
    for key in keys:
        if key in model:
            return int(model[key].shape[0])
    return None


def language_pair(args: argparse.Namespace, data_bin: str, source_lang=None,
                  target_lang=None) -> Tuple[str, str]:
    """The (source, target) languages whose dict.LANG.txt the translation model is built from, as the
    converter and fairseq's translation task choose them: --source-lang/--target-lang, else the ones the
    checkpoint records, else the pair DATA_BIN's file names give. ExportError when there is none, when
    only one of the two is known, or when the pair is the reverse of the model's direction (the one the
    checkpoint records, else the only pair DATA_BIN holds, which fairseq-train would have inferred)."""
    recorded = (getattr(args, "source_lang", None), getattr(args, "target_lang", None))
    src, tgt = source_lang or recorded[0], target_lang or recorded[1]
    pairs = _pairs(data_bin)
    if (src is None) != (tgt is None):
        given, missing = ("--source-lang", "target") if src is not None else ("--target-lang", "source")
        raise ExportError(f"{given} alone: pass both --source-lang and --target-lang (the checkpoint records no "
                          f"{missing} language; {data_bin}'s dictionaries: {_dictionaries(data_bin)})")
    if src is None:
        if not pairs:
            found = _dictionaries(data_bin)
            kind = ", a language model's data-bin" if found == "dict.txt" else ""
            raise ExportError(f"{data_bin} is not a translation data-bin: no file is named like "
                              f"train.SRC-TGT.SRC.idx to give the language pair, and the checkpoint records none "
                              f"(dictionaries found: {found}{kind}); {TRAINED_ON}, or "
                              f"--source-lang and --target-lang naming its dict.LANG.txt files")
        src, tgt = data_utils.infer_language_pair(data_bin)  # fairseq's choice where there are several
    direction = recorded if None not in recorded else (next(iter(pairs)) if len(pairs) == 1 else None)
    if direction is not None and (src, tgt) == direction[::-1] and src != tgt:
        origin = "the checkpoint's" if None not in recorded else f"the only pair {data_bin}'s files are named by"
        raise ExportError(f"--source-lang {src} --target-lang {tgt} is the reverse of the model's direction "
                          f"{direction[0]}->{direction[1]} ({origin}); pass --source-lang {direction[0]} "
                          f"--target-lang {direction[1]}, or neither")
    return src, tgt


def check_translation_dictionaries(model: dict, data_bin: str, src: str, tgt: str) -> None:
    """DATA_BIN's dict.{src}.txt and dict.{tgt}.txt exist and have as many entries as the checkpoint's
    encoder and decoder embeddings have rows; ExportError naming the sizes otherwise."""
    for lang in (src, tgt):
        if not os.path.isfile(os.path.join(data_bin, f"dict.{lang}.txt")):
            raise ExportError(f"{data_bin} has no dict.{lang}.txt for the language pair {src}-{tgt} "
                              f"(dictionaries found: {_dictionaries(data_bin)}); {TRAINED_ON}, or "
                              f"--source-lang and --target-lang naming its dict.LANG.txt files")
    want = (_rows(model, "encoder.embed_tokens.weight"),
            _rows(model, "decoder.embed_tokens.weight", "decoder.output_projection.weight"))
    have = (_dictionary_size(data_bin, f"dict.{src}.txt"), _dictionary_size(data_bin, f"dict.{tgt}.txt"))
    if all(w is None or w == h for w, h in zip(want, have)):
        return
    raise ExportError(f"{data_bin}'s dictionaries do not match the checkpoint: dict.{src}.txt has {have[0]} "
                      f"entries and dict.{tgt}.txt {have[1]}, the checkpoint's source vocabulary {want[0]} and "
                      f"target vocabulary {want[1]}; {TRAINED_ON}")


def check_lm_dictionary(model: dict, data_bin: str) -> None:
    """DATA_BIN's dict.txt exists and has as many entries as the checkpoint's decoder embeddings have
    rows; ExportError naming the sizes otherwise."""
    if not os.path.isfile(os.path.join(data_bin, "dict.txt")):
        raise ExportError(f"{data_bin} has no dict.txt, the dictionary of a language model's data-bin "
                          f"(fairseq-preprocess --only-source; dictionaries found: {_dictionaries(data_bin)}); "
                          f"{TRAINED_ON}")
    want = _rows(model, "decoder.embed_tokens.weight", "decoder.output_projection.weight")
    have = _dictionary_size(data_bin, "dict.txt")
    if want is not None and want != have:
        raise ExportError(f"{data_bin}'s dictionary does not match the checkpoint: dict.txt has {have} entries, "
                          f"the checkpoint's vocabulary {want}; {TRAINED_ON}")


def _unrepresentable(args: argparse.Namespace, language_model: bool) -> Dict[str, bool]:
    """{option: set} for the options of fairseq's transformer and transformer_lm that CTranslate2's fairseq
    converter does not check and its model spec cannot hold (the converter's own refusals, e.g.
    --activation-fn or --adaptive-input, are its to make)."""
    def get(name, default=None):
        value = getattr(args, name, default)
        return default if value is None else value

    options = {
        # no output_projection: the converter fails on a None module
        "--adaptive-softmax-cutoff": get("adaptive_softmax_cutoff") is not None,
        # normformer's extra layer norms and head scales: the converter would drop them
        "--scale-attn": bool(get("scale_attn", False)), "--scale-fc": bool(get("scale_fc", False)),
        "--scale-heads": bool(get("scale_heads", False)), "--scale-resids": bool(get("scale_resids", False)),
        "--base-layers": get("base_layers", 0) > 0,
        # the model has other layers than --encoder/decoder-layers say
        "--encoder-layers-to-keep": get("encoder_layers_to_keep") is not None,
        "--decoder-layers-to-keep": get("decoder_layers_to_keep") is not None,
        "--cross-self-attention": bool(get("cross_self_attention", False)),
        "--no-cross-attention": bool(get("no_cross_attention", False)) and not language_model,
    }
    if language_model:
        embed = get("decoder_embed_dim")
        # CTranslate2 projects the embeddings in and the output back out together, or neither
        options["--decoder-input-dim/--decoder-output-dim (one projected, not the other)"] = (
            (get("decoder_input_dim", embed) != embed) != (get("decoder_output_dim", embed) != embed))
        options["--output-dictionary-size"] = get("output_dictionary_size", -1) != -1
    return options


def check_representable(args: argparse.Namespace, language_model: bool) -> None:
    """ExportError naming every option set in `args` that CTranslate2 cannot represent."""
    refused = [option for option, bad in _unrepresentable(args, language_model).items() if bad]
    if refused:
        raise ExportError(f"CTranslate2 cannot represent {', '.join(refused)} (set in the checkpoint's config); "
                          f"only models without them can be exported")


def unsupported_message(err: ValueError) -> Optional[str]:
    """The converter's own refusal (ctranslate2.converters.utils.raise_unsupported: a header and one
    '- reason' line each) as one line; None for any other error."""
    text = str(err)
    if not text.startswith("The model you are trying to convert is not supported by CTranslate2"):
        return None
    reasons = [line[2:].strip() for line in text.splitlines() if line.startswith("- ")]
    return f"CTranslate2 cannot represent this model: {'; '.join(reasons)}"
