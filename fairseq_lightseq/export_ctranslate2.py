"""`python -m fairseq_lightseq.export_ctranslate2 CHECKPOINT DATA_BIN OUTPUT_DIR`: a CTranslate2 model
directory from a translation checkpoint of ours (or of fairseq's transformer), for serving.

    python -m fairseq_lightseq.export_ctranslate2 checkpoints/checkpoint_best.pt data-bin ct2_model \\
        [--quantization int8] [--force] [--source-lang en --target-lang de]

CTranslate2's own `ct2-fairseq-converter` refuses our checkpoints: it converts only the fairseq models it
knows (`transformer`, ...), by their registered name, and it reads the checkpoint with torch's safe loader,
which refuses a fairseq checkpoint's Namespace and omegaconf objects unless the plugin was imported. So
this command does what the manual route does, in one process:

1. read the checkpoint with the plugin's safe reader (checkpoints.io.load_file; importing the package
   allow-lists exactly what fairseq checkpoints contain, checkpoints.safety);
2. rename ls_transformer_X -> transformer_X (and the criterion and optimizer) with the code of
   `scripts/convert_checkpoint.py --to fairseq` (checkpoints.convert): the weights are fairseq's already;
3. write only what the converter reads (args, cfg, model; not the Adam moments) to a temporary file next
   to OUTPUT_DIR;
4. call CTranslate2's converter (`ctranslate2.converters.FairseqConverter(...).convert(...)`), which builds
   fairseq's transformer from DATA_BIN's dictionaries, loads the weights and writes its model spec; its
   checks (e.g. the same normalize-before on both sides) and its quantizations apply unchanged.

Only the translation family can be exported: CTranslate2's fairseq converter has no RoBERTa model, and it
reads a language model's config as an argparse Namespace, which fairseq's transformer_lm records as a
dict (so does our converter's --to fairseq output).

CTranslate2 translates tokens: give `ctranslate2.Translator(OUTPUT_DIR).translate_batch` the source as
the token list fairseq-generate sees (after your BPE or sentencepiece), without </s>; see docs/usage.md.
"""
import argparse
import os
import pickle
import tempfile

from .checkpoints.convert import convert_state, recorded_arch
from .checkpoints.io import CheckpointReadError, load_file
from .models.families import FAMILIES, PREFIX, family_of

INSTALL = "pip install ctranslate2"


class ExportError(ValueError):
    """The checkpoint, data-bin or output directory cannot be exported as asked; the message says why."""


def _ctranslate2():
    try:
        import ctranslate2
        import ctranslate2.converters
    except ImportError as e:
        raise ExportError(f"exporting to CTranslate2 needs the ctranslate2 package ({INSTALL}): {e}") from None
    return ctranslate2


def _check_paths(checkpoint: str, data_bin: str, output_dir: str, force: bool) -> None:
    """Fail before any work (reading a large checkpoint, building the model) on a wrong path."""
    if not os.path.isfile(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} is not a file")
    if not os.path.isdir(data_bin):
        raise ExportError(f"data-bin {data_bin} is not a directory (the fairseq-preprocess output the model "
                          f"was trained on: its dict.*.txt are the model's vocabularies)")
    if os.path.exists(output_dir) and not force:
        raise ExportError(f"output directory {output_dir} already exists (--force replaces it)")


def native_translation_state(state: dict) -> dict:
    """The parts of a loaded translation checkpoint that CTranslate2's converter reads (args, cfg, model),
    with fairseq's names: ls_transformer_X -> transformer_X; a fairseq transformer checkpoint as it is.
    ExportError for a checkpoint of another family or none."""
    arch = recorded_arch(state)
    if arch is None:
        raise ExportError("the checkpoint records no model architecture (no args.arch / cfg.model._name)")
    try:
        family = family_of(arch)
    except ValueError as e:
        raise ExportError(str(e)) from None
    translation = FAMILIES["translation"]
    if family is not translation:
        raise ExportError(f"only translation models ({translation.model}, {translation.native} and their "
                          f"architectures) can be exported to CTranslate2; {arch!r} is a {family.task} model")
    if arch.startswith(PREFIX):
        convert_state(state, "fairseq")
    return {key: state.get(key) for key in ("args", "cfg", "model")}


def export(checkpoint: str, data_bin: str, output_dir: str, quantization=None, force: bool = False,
           source_lang=None, target_lang=None) -> str:
    """Writes the CTranslate2 model of `checkpoint` (vocabularies from `data_bin`) to `output_dir` and
    returns it; ExportError (a ValueError) with the reason when it cannot."""
    ctranslate2 = _ctranslate2()
    accepted = ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES
    if quantization is not None and quantization not in accepted:
        raise ExportError(f"--quantization {quantization} is not one of CTranslate2's ({', '.join(accepted)})")
    _check_paths(checkpoint, data_bin, output_dir, force)
    import torch

    native = native_translation_state(load_file(checkpoint))
    parent = os.path.dirname(os.path.abspath(output_dir))  # the output's disk has room for the weights
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".export_ctranslate2.", dir=parent) as tmp:
        path = os.path.join(tmp, "checkpoint_fairseq.pt")
        torch.save(native, path)
        # No user_dir: this process imported the plugin already, whose allowlist lets CTranslate2's
        # torch.load(weights_only=True) read the file; the model it builds is fairseq's transformer.
        converter = ctranslate2.converters.FairseqConverter(path, data_bin, source_lang=source_lang,
                                                            target_lang=target_lang)
        return converter.convert(output_dir, quantization=quantization, force=force)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_lightseq.export_ctranslate2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a translation checkpoint (ls_transformer* or transformer*)")
    parser.add_argument("data_bin", help="the fairseq-preprocess directory the model was trained on")
    parser.add_argument("output_dir", help="the CTranslate2 model directory to write")
    parser.add_argument("--quantization", default=None,
                        help="CTranslate2's weight type (int8, float16, ...: its ACCEPTED_MODEL_TYPES); "
                             "default: the checkpoint's dtype")
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    parser.add_argument("--source-lang", default=None, help="default: the one the checkpoint records")
    parser.add_argument("--target-lang", default=None, help="default: the one the checkpoint records")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.data_bin, args.output_dir, args.quantization, args.force,
                     args.source_lang, args.target_lang)
    # ours, CTranslate2's option checks, a missing dict.*.txt, a damaged file, an object the safe loader refuses
    except (ValueError, FileNotFoundError, CheckpointReadError, pickle.UnpicklingError) as e:
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(f"wrote {out} (CTranslate2, weights {args.quantization or 'as stored'}) from {args.checkpoint}")
    return out


if __name__ == "__main__":
    main()
