"""The fairseq this plugin needs, checked when it is imported (the package's metadata cannot say it:
fairseq is published as `fairseq` and, installable on Python 3.11+, as `fairseq-fixed`; a requirement
on one makes pip fetch and build it next to the other, see pyproject.toml).

The plugin relies on fairseq 0.12's internals (its registries and argument post-processing, the
checkpoint and distributed helpers it wraps), so it asks for 0.12.2 <= fairseq < 0.13: upstream
fairseq 0.12.2 (where it imports: Python <= 3.10) or fairseq-fixed 0.12.3.x.
"""
import re

MIN_FAIRSEQ = (0, 12, 2)
MAX_FAIRSEQ = (0, 13)  # exclusive
INSTALL_HINT = ("install fairseq 0.12: `pip install --no-build-isolation fairseq-fixed==0.12.3.1` "
                "(Python 3.11+) or `pip install fairseq==0.12.2` (Python <= 3.10)")


def parse_version(text: str):
    """(0, 12, 3, 1) from "0.12.3.1"; a local or pre-release suffix ("+cu", "a0", ".dev1") is ignored."""
    return tuple(int(x) for x in re.findall(r"\d+", re.split(r"[+a-zA-Z]", text.strip(), maxsplit=1)[0]))


def fairseq_problem(version):
    """None if fairseq `version` (a string, or None when fairseq is missing) fits, else what is wrong."""
    need = f"fairseq_lightseq needs fairseq >= {'.'.join(map(str, MIN_FAIRSEQ))}, < {'.'.join(map(str, MAX_FAIRSEQ))}"
    if version is None:
        return f"{need}, and fairseq is not installed: {INSTALL_HINT}"
    v = parse_version(version)
    if not MIN_FAIRSEQ <= v < MAX_FAIRSEQ:
        return f"{need}, found fairseq {version}: {INSTALL_HINT}"
    return None


def check_fairseq() -> None:
    """Raises ImportError naming what is needed when fairseq is missing or not 0.12.x."""
    try:
        import fairseq
    except ModuleNotFoundError as e:
        if e.name != "fairseq":
            raise  # fairseq is there but one of its own imports is missing: fairseq's error says which
        version = None
    else:
        version = getattr(fairseq, "__version__", "unknown")
    problem = fairseq_problem(version)
    if problem:
        raise ImportError(problem)


def install() -> None:
    """The check, as the first patch (patches.install)."""
    check_fairseq()
