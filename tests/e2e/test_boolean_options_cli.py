"""Every --ls-* BOOL option of every ls_* model takes one parser (models.common.boolean), through fairseq's own
command-line parser: true/false, yes/no, on/off, 1/0 in any case (fairseq's True/False among them); any
other value is argparse's error naming the option, exit status 2, and the value is never evaluated as
Python (fairseq's eval_bool would run it). In this process (fairseq's parse_args_and_arch of fairseq-train's
arguments), and once as a fairseq-train process. Marked `e2e`."""
import argparse
import os
import subprocess

import pytest

from fairseq import options
from fairseq_lightseq.models.common import boolean
from fairseq_lightseq.models.ls_roberta import LSRobertaModel
from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel

from support.cli import BIN, USER_DIR, env

pytestmark = pytest.mark.e2e

FAMILIES = {"ls_transformer": ("translation", LSTransformerModel),
            "ls_transformer_lm": ("language_modeling", LSTransformerLanguageModel),
            "ls_roberta": ("masked_lm", LSRobertaModel)}
BOOL_OPTIONS = ("--ls-packed", "--ls-recompute-attention")
ACCEPTED = [("True", True), ("False", False), ("true", True), ("FALSE", False), ("yes", True), ("No", False),
            ("on", True), ("OFF", False), ("1", True), ("0", False)]


def injection(path: str) -> str:
    """A value that runs a shell command creating `path` if anything evaluates it as Python."""
    return f"__import__('os').system('touch {path}') or 1"


def parse(tmp_path, arch: str, *extra):
    """fairseq-train's arguments parsed by fairseq (options.parse_args_and_arch) with the plugin."""
    task, _ = FAMILIES[arch]
    return options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(tmp_path), "--task", task, "--arch", arch, "--user-dir", USER_DIR, *extra])


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_ls_option_is_a_choice_or_a_boolean(arch):
    """The model's --ls-* options: each either has choices or takes `boolean`; BOOL_OPTIONS are the booleans."""
    parser = argparse.ArgumentParser()
    FAMILIES[arch][1].add_args(parser)
    ls = [a for a in parser._actions if any(s.startswith("--ls-") for s in a.option_strings)]
    assert all(a.choices is not None or a.type is boolean for a in ls), [(a.option_strings, a.type) for a in ls]
    assert sorted(a.option_strings[0] for a in ls if a.type is boolean) == sorted(BOOL_OPTIONS)


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("option", BOOL_OPTIONS)
def test_the_words_of_a_boolean(tmp_path, arch, option):
    attr = option[2:].replace("-", "_")
    for word, value in ACCEPTED:
        assert getattr(parse(tmp_path, arch, option, word), attr) is value, word


@pytest.mark.parametrize("option", BOOL_OPTIONS)
@pytest.mark.parametrize("value", ["maybe", "2", "", "injection"])
def test_other_values_are_refused_naming_the_option_and_never_run(tmp_path, capsys, option, value):
    witness = tmp_path / "evaluated"
    if value == "injection":
        value = injection(str(witness))
    with pytest.raises(SystemExit) as exit_:
        parse(tmp_path, "ls_transformer", option, value)
    assert exit_.value.code == 2
    assert f"argument {option}: expected a boolean" in capsys.readouterr().err
    assert not witness.exists()


def test_fairseq_train_refuses_an_expression_without_running_it(tmp_path):
    """The process: exit status 2, argparse's one error line last on stderr, the shell command not run."""
    witness = tmp_path / "evaluated"
    r = subprocess.run([os.path.join(BIN, "fairseq-train"), str(tmp_path), "--user-dir", USER_DIR,
                        "--arch", "ls_transformer", "--cpu", "--ls-recompute-attention", injection(str(witness))],
                       capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-train: error: argument --ls-recompute-attention: expected a boolean"), last
    assert "Traceback" not in r.stderr
    assert not witness.exists()
