"""`python -m fairseq_lightseq.export_ctranslate2 CHECKPOINT DATA_BIN OUTPUT_DIR`: a CTranslate2 model
directory from a translation or language-model checkpoint of ours (or of fairseq's transformer /
transformer_lm), or from a BART/mBART fine-tuned with fairseq's translation task, for serving with
`ctranslate2.Translator` or `ctranslate2.Generator`.

    python -m fairseq_lightseq.export_ctranslate2 checkpoints/checkpoint_best.pt data-bin ct2_model \\
        [--quantization int8] [--force] [--source-lang en --target-lang de]

CTranslate2's own `ct2-fairseq-converter` refuses our checkpoints: it converts only the fairseq models it
knows (`transformer`, `transformer_lm`, ...), by their registered name, and it reads the checkpoint with
torch's safe loader, which refuses a fairseq checkpoint's Namespace and omegaconf objects unless the plugin
was imported. So this command does what the manual route does, in one process:

1. read the checkpoint with the plugin's safe reader (checkpoints.io.load_file; importing the package
   allow-lists exactly what fairseq checkpoints contain, checkpoints.safety);
2. rename ls_transformer_X -> transformer_X, ls_transformer_lm_X -> transformer_lm_X (and the criterion and
   optimizer) with the code of `scripts/convert_checkpoint.py --to fairseq` (checkpoints.convert): the
   weights are fairseq's already;
3. check what the converter would fail on with a traceback or convert wrongly (checkpoints.export_checks):
   DATA_BIN's dictionaries against the checkpoint's embeddings, the language pair, options CTranslate2
   cannot hold;
4. write only what the converter reads to a temporary file next to OUTPUT_DIR: for a translation model
   args, cfg and model; for a language model the weights and `args`, the argparse Namespace of task and
   model options that the converter reads (fairseq's transformer_lm records them as two dicts, cfg.task
   and cfg.model; the converter sets attributes on what it finds, so a dict fails);
5. call CTranslate2's converter (`ctranslate2.converters.FairseqConverter(...).convert(...)`), which builds
   fairseq's model from DATA_BIN's dictionaries, loads the weights and writes its model spec; its checks
   (e.g. the same normalize-before on both sides) and its quantizations apply unchanged.

RoBERTa cannot be exported: CTranslate2's fairseq converter has no RoBERTa model. BART and mBART (ls_bart*,
ls_mbart*, fairseq's bart*, mbart*) are exported when fine-tuned with fairseq's `translation` task: the converter
reads a `bart` model as a translation model of that task (the source followed by </s>, decoding from </s>).
Every other task of theirs is refused by name (BART_TASKS): `translation_from_pretrained_bart` decodes
differently (each source ends with its language token [src], and a translation starts and ends with [tgt],
which the converter does not place), and the pretraining and classification tasks make no translator.

CTranslate2 works on tokens: give `ctranslate2.Translator(OUTPUT_DIR).translate_batch` the source as the
token list fairseq-generate sees (after your BPE or sentencepiece), without </s>, and a language model's
`ctranslate2.Generator(OUTPUT_DIR).generate_batch` the prompt after "</s>" (fairseq's start token for a
language model without --add-bos-token); see docs/usage.md.
"""
import argparse
import os
import pickle
import tempfile

from .checkpoints.convert import convert_state, recorded_arch
from .checkpoints.export_checks import (ExportError, check_lm_dictionary, check_representable,
                                        check_translation_dictionaries, language_pair, unsupported_message)
from .checkpoints.io import CheckpointReadError, load_file
from .models.families import FAMILIES, PREFIX, family_of

INSTALL = "pip install ctranslate2"
EXPORTED = ("translation", "language_model", "bart")
# Why a BART/mBART checkpoint of each task but `translation` is not exported (see the module docstring).
BART_TASKS = {
    "translation_from_pretrained_bart": "its sources end with their language token and its translations start "
                                        "and end with the target's, which CTranslate2's converter does not place "
                                        "(it decodes from </s>)",
    "denoising": "a pretrained BART reconstructs text, it is no translation model",
    "multilingual_denoising": "a pretrained mBART reconstructs text, it is no translation model",
    "sentence_prediction": "a classifier has no decoder output to translate with",
}


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


def _family(arch: str):
    """(name, Family) of `arch`: ours or its fairseq counterpart, or another fairseq architecture of a
    family's native model (fairseq's transformer_lm_wiki103 has no ls_ twin: its options are refused by
    the checks, not its name)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    try:
        family = family_of(arch)
    except ValueError as e:
        family = next((f for f in FAMILIES.values() if ARCH_MODEL_NAME_REGISTRY.get(arch) == f.native), None)
        if family is None:
            raise ExportError(str(e)) from None
    return next(name for name, f in FAMILIES.items() if f is family), family


def _lm_args(state: dict) -> argparse.Namespace:
    """The Namespace CTranslate2's converter reads for a language model (with fairseq's names): a legacy
    checkpoint's `args` as it is; else cfg.task's options, then cfg.model's over them (a None of the model
    config, e.g. max_target_positions that fairseq fills from the task at build, does not hide the task's),
    with `task` and `arch` the two configs' names."""
    if isinstance(state.get("args"), argparse.Namespace):
        return state["args"]
    task, model = dict(state["cfg"]["task"]), dict(state["cfg"]["model"])  # fairseq's: plain dicts
    merged = dict(task)
    merged.update({k: v for k, v in model.items() if v is not None or k not in merged})
    merged.update(task=task["_name"], arch=model.get("arch") or model["_name"])
    merged.pop("_name")
    return argparse.Namespace(**merged)


def recorded_task(state: dict):
    """The task a loaded checkpoint was trained with (`args.task`, else cfg.task's _name), or None."""
    args, cfg = state.get("args"), state.get("cfg")
    if args is not None and getattr(args, "task", None):
        return args.task
    task = cfg.get("task") if cfg is not None else None
    if isinstance(task, argparse.Namespace):
        return getattr(task, "_name", None) or getattr(task, "task", None)
    return task.get("_name") if task is not None else None


def check_bart_task(state: dict, arch: str) -> None:
    """ExportError unless the BART/mBART checkpoint was fine-tuned with fairseq's translation task."""
    task = recorded_task(state)
    if task == "translation":
        return
    why = BART_TASKS.get(task, "CTranslate2's converter reads a BART as a model of fairseq's translation task")
    raise ExportError(f"{arch!r} was trained with --task {task}: CTranslate2 can serve a BART/mBART fine-tuned with "
                      f"--task translation only ({why})")


def native_state(state: dict):
    """(family name, what CTranslate2's converter reads) of a loaded checkpoint, with fairseq's names:
    ls_X -> X; a fairseq checkpoint as it is. For a translation model {args, cfg, model}; for a language
    model {args: the Namespace of task and model options, model}. ExportError for a checkpoint of another
    family or none."""
    arch = recorded_arch(state)
    if arch is None:
        raise ExportError("the checkpoint records no model architecture (no args.arch / cfg.model._name)")
    name, family = _family(arch)
    if name not in EXPORTED:
        kinds = ", ".join(f"{FAMILIES[n].model}, {FAMILIES[n].native}" for n in EXPORTED)
        raise ExportError(f"only translation and language models and BART ({kinds} and their architectures) can be "
                          f"exported to CTranslate2; {arch!r} is a {family.task} model")
    if name == "bart":
        check_bart_task(state, arch)
    if arch.startswith(PREFIX):
        convert_state(state, "fairseq")
    if name == "language_model":
        return name, {"args": _lm_args(state), "cfg": None, "model": state["model"]}
    return name, {key: state.get(key) for key in ("args", "cfg", "model")}


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

    family, native = native_state(load_file(checkpoint))
    args = native["args"] or native["cfg"]["model"]  # what the converter reads
    language_model = family == "language_model"
    check_representable(args, language_model)
    if language_model:
        if source_lang or target_lang:
            raise ExportError("--source-lang/--target-lang are for translation models; a language model has one "
                              "dictionary, DATA_BIN's dict.txt")
        check_lm_dictionary(native["model"], data_bin)
    else:
        source_lang, target_lang = language_pair(args, data_bin, source_lang, target_lang)
        check_translation_dictionaries(native["model"], data_bin, source_lang, target_lang)
    parent = os.path.dirname(os.path.abspath(output_dir))  # the output's disk has room for the weights
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".export_ctranslate2.", dir=parent) as tmp:
        path = os.path.join(tmp, "checkpoint_fairseq.pt")
        torch.save(native, path)
        # No user_dir: this process imported the plugin already, whose allowlist lets CTranslate2's
        # torch.load(weights_only=True) read the file; the model it builds is fairseq's.
        converter = ctranslate2.converters.FairseqConverter(path, data_bin, source_lang=source_lang,
                                                            target_lang=target_lang)
        try:
            return converter.convert(output_dir, quantization=quantization, force=force)
        except ValueError as e:
            message = unsupported_message(e)
            if message is None:
                raise
            raise ExportError(message) from None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_lightseq.export_ctranslate2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a translation or language-model checkpoint (ls_transformer*, "
                                           "ls_transformer_lm*, or fairseq's transformer*, transformer_lm*), or a "
                                           "BART/mBART fine-tuned with --task translation (ls_bart*, ls_mbart*, "
                                           "bart*, mbart*)")
    parser.add_argument("data_bin", help="the fairseq-preprocess directory the model was trained on")
    parser.add_argument("output_dir", help="the CTranslate2 model directory to write")
    parser.add_argument("--quantization", default=None,
                        help="CTranslate2's weight type (int8, float16, ...: its ACCEPTED_MODEL_TYPES); "
                             "default: the checkpoint's dtype")
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    parser.add_argument("--source-lang", default=None,
                        help="a translation model's; default: the one the checkpoint records, else DATA_BIN's")
    parser.add_argument("--target-lang", default=None,
                        help="a translation model's; default: the one the checkpoint records, else DATA_BIN's")
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
