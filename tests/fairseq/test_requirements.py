"""Importing fairseq_lightseq checks for fairseq 0.12 (pyproject.toml cannot name it) and says what
to install; the checks run in a fresh interpreter, with fairseq hidden or reporting another version."""
import subprocess
import sys

import pytest

from support import ROOT
from fairseq_lightseq.patches.requirements import fairseq_problem, parse_version


@pytest.mark.parametrize("text,expected", [("0.12.3.1", (0, 12, 3, 1)), ("0.12.2", (0, 12, 2)),
                                           ("0.12.2+cu121", (0, 12, 2)), ("1.0.0a0", (1, 0, 0))])
def test_parse_version(text, expected):
    assert parse_version(text) == expected


@pytest.mark.parametrize("version", ["0.12.2", "0.12.3.1", "0.12.2+local"])
def test_fairseq_012_fits(version):
    assert fairseq_problem(version) is None


@pytest.mark.parametrize("version", ["0.10.2", "0.12.1", "0.13.0", "1.0.0a0", "unknown"])
def test_other_fairseq_versions_are_named(version):
    msg = fairseq_problem(version)
    assert f"found fairseq {version}" in msg and ">= 0.12.2, < 0.13" in msg and "fairseq-fixed==0.12.3.1" in msg


def import_in_child(prelude):
    code = f"import sys; sys.path.insert(0, {ROOT!r}); {prelude}; import fairseq_lightseq"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_without_fairseq_says_what_to_install():
    r = import_in_child("sys.modules['fairseq'] = None")  # as if not installed
    assert r.returncode != 0
    assert "ImportError: fairseq_lightseq needs fairseq >= 0.12.2, < 0.13, and fairseq is not installed" in r.stderr
    assert "pip install --no-build-isolation fairseq-fixed==0.12.3.1" in r.stderr


def test_import_with_other_fairseq_version_fails_clearly():
    r = import_in_child("import fairseq; fairseq.__version__ = '0.13.0'")
    assert r.returncode != 0 and "found fairseq 0.13.0" in r.stderr, r.stderr[-2000:]


def test_import_with_installed_fairseq_succeeds():
    r = import_in_child("pass")
    assert r.returncode == 0, r.stderr[-2000:]
