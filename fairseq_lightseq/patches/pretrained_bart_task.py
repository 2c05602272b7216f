"""fairseq's `--task translation_from_pretrained_bart` (mBART fine-tuning and generation) made to run.

The defect (fairseq 0.12.2 and fairseq-fixed 0.12.3.x): TranslationFromPretrainedBARTTask is registered
without a dataclass, and its base TranslationTask keeps the options it is built with as `self.cfg`
(FairseqTask.__init__); the task still reads them as `self.args` in load_dataset, build_generator and
build_dataset_for_inference, so fairseq-train stops in load_dataset with "'TranslationFromPretrainedBARTTask'
object has no attribute 'args'", and fairseq-generate and the hub would stop the same way. The options are
the same object under either name (the argparse Namespace of the command line, or the task config a
checkpoint recorded), so the fix gives the class a read-only `args` that is its `cfg`.

--langs, when the task is set up (fairseq-train, fairseq-generate, the hub's from_pretrained: every one goes
through setup_task):
- the language pair the task uses, given (-s/-t) or, without them, the one fairseq's setup_task takes from
  the data-bin's file names, must have its language tokens among --langs. Otherwise the dictionary has no
  `[lang]`: its index is <unk>, appended to every source and used as the generator's end of sentence, and
  the run trains and decodes wrongly without a word. So the pair is checked after fairseq's setup_task
  found it, and the refusal says where an inferred language came from;
- a missing --langs is refused (fairseq: "'NoneType' object has no attribute 'split'");
- spaces around the names are dropped (`--langs "en_XX, de_DE"` is `en_XX,de_DE`) and the options keep the
  stripped list, which the checkpoint then records. fairseq splits on "," only and adds `[ de_DE]`, a token
  at the position `[de_DE]` would have, so the model's rows are the same either way; what the strip changes
  is that `[de_DE]` is then found by name (as the generator's end of sentence, the source's language tag)
  instead of being <unk>. An empty name (`en_XX,,de_DE`, a trailing comma) is refused: fairseq would add a
  `[]` token, one row more than the pretrained model has.
Each refusal is a ConfigurationError: fairseq's commands end on it with its one line (patches/refusal_exit).
"""
from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask

from ..errors import ConfigurationError
from .wrap import replace

TASK = "translation_from_pretrained_bart"
SIDES = (("source_lang", "-s/--source-lang"), ("target_lang", "-t/--target-lang"))


def task_args(task):
    """The task's options (its cfg), where fairseq's code reads `self.args`."""
    return task.cfg


def normalize_langs(cfg) -> None:
    """Rewrites cfg.langs with its names stripped of spaces (comma-joined); ConfigurationError when --langs is
    missing or names an empty language. cfg: the task's options (a Namespace or a task config)."""
    langs = getattr(cfg, "langs", None)
    if not langs:
        raise ConfigurationError(f"--task {TASK} needs --langs, the comma-separated languages of the pretrained "
                                 "model in its pretraining order (e.g. --langs en_XX,de_DE,...)")
    names = [name.strip() for name in str(langs).split(",")]
    if not all(names):
        raise ConfigurationError(f"--task {TASK}: --langs {langs!r} has an empty language name (two commas, or one "
                                 "at an end); list each language of the pretrained model once, comma-separated")
    if ",".join(names) != langs:
        cfg.langs = ",".join(names)


def check_pair(cfg, inferred=()) -> None:
    """ConfigurationError when the task's source or target language has no token among --langs (normalized).
    inferred: the options ("source_lang", "target_lang") that fairseq took from the data-bin's file names."""
    listed = cfg.langs.split(",")
    for option, flag in SIDES:
        lang = getattr(cfg, option, None)
        if lang is None or lang in listed:
            continue
        named = (f"the {option.split('_')[0]} language {lang} (taken from the data-bin's file names: no {flag} "
                 "given)" if option in inferred else f"--{option.replace('_', '-')} {lang}")
        raise ConfigurationError(f"--task {TASK}: {named} is not in --langs {cfg.langs}, so the dictionary has no "
                                 f"language token [{lang}]; list it in --langs (in the pretrained model's order)")


def _checked_setup_task(setup_task):
    """TranslationTask.setup_task (the task's, inherited) between the --langs checks: the list before (the
    task's constructor splits it), the pair after fairseq's setup_task has inferred a missing one."""
    def checked(cls, cfg, **kwargs):
        normalize_langs(cfg)
        inferred = [option for option, _ in SIDES if getattr(cfg, option, None) is None]
        task = setup_task(cls, cfg, **kwargs)
        check_pair(cfg, inferred)
        return task
    checked.__doc__ = setup_task.__doc__
    return classmethod(checked)


def install() -> None:
    """Gives TranslationFromPretrainedBARTTask its `args` and the --langs checks (idempotent: the class's own
    attributes are ours once set)."""
    own = TranslationFromPretrainedBARTTask.__dict__
    if "args" not in own:
        replace(TranslationFromPretrainedBARTTask, "args", property(task_args))
    if "setup_task" not in own:
        replace(TranslationFromPretrainedBARTTask, "setup_task",
                _checked_setup_task(TranslationFromPretrainedBARTTask.setup_task.__func__))
