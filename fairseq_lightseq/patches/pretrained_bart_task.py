"""fairseq's `--task translation_from_pretrained_bart` (mBART fine-tuning and generation) made to run.

The defect (fairseq 0.12.2 and fairseq-fixed 0.12.3.x): TranslationFromPretrainedBARTTask is registered
without a dataclass, and its base TranslationTask keeps the options it is built with as `self.cfg`
(FairseqTask.__init__); the task still reads them as `self.args` in load_dataset, build_generator and
build_dataset_for_inference, so fairseq-train stops in load_dataset with "'TranslationFromPretrainedBARTTask'
object has no attribute 'args'", and fairseq-generate and the hub would stop the same way. The options are
the same object under either name (the argparse Namespace of the command line, or the task config a
checkpoint recorded), so the fix gives the class a read-only `args` that is its `cfg`.

Two inputs the task takes silently and then trains or decodes wrongly are refused when it is set up, each
naming the option: a --source-lang or --target-lang without its language token among --langs (the
dictionary then has no `[lang]`: its index is <unk>, appended to every source and used as the generator's
end-of-sentence), and a missing --langs (fairseq: "'NoneType' object has no attribute 'split'").
"""
from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask

from .wrap import replace

TASK = "translation_from_pretrained_bart"


def task_args(task):
    """The task's options (its cfg), where fairseq's code reads `self.args`."""
    return task.cfg


def check_languages(cfg) -> None:
    """ValueError naming the option when --langs is missing or lacks --source-lang / --target-lang.
    cfg: the task's options (a Namespace or a task config)."""
    langs = getattr(cfg, "langs", None)
    if not langs:
        raise ValueError(f"--task {TASK} needs --langs, the comma-separated languages of the pretrained model "
                         "in its pretraining order (e.g. --langs en_XX,de_DE,...)")
    listed = langs.split(",")
    for option in ("source_lang", "target_lang"):
        lang = getattr(cfg, option, None)
        if lang is not None and lang not in listed:
            raise ValueError(f"--task {TASK}: --{option.replace('_', '-')} {lang} is not in --langs {langs}, so the "
                             f"dictionary has no language token [{lang}]; list it in --langs (in the pretrained "
                             "model's order)")


def _checked_setup_task(setup_task):
    """TranslationTask.setup_task (the task's, inherited) with check_languages first."""
    def checked(cls, cfg, **kwargs):
        check_languages(cfg)
        return setup_task(cls, cfg, **kwargs)
    checked.__doc__ = setup_task.__doc__
    return classmethod(checked)


def install() -> None:
    """Gives TranslationFromPretrainedBARTTask its `args` and the language checks (idempotent: the class's
    own attributes are ours once set)."""
    own = TranslationFromPretrainedBARTTask.__dict__
    if "args" not in own:
        replace(TranslationFromPretrainedBARTTask, "args", property(task_args))
    if "setup_task" not in own:
        replace(TranslationFromPretrainedBARTTask, "setup_task",
                _checked_setup_task(TranslationFromPretrainedBARTTask.setup_task.__func__))
