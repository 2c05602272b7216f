"""What every benchmark JSON records about where its figures come from: the commit of the tree measured
(`commit`), and no path of the machine it ran on (`scrub_paths`: the checkout, the temporary directory
and the home directory become `<repo>`, `<tmp>`, `<home>` in every string)."""
import os
import subprocess
import tempfile
from typing import Optional


def commit(repo: str) -> dict:
    """{"commit": the checkout's HEAD (40 hex digits, None outside git), "dirty": whether tracked files
    differ from it (None outside git)}."""
    def git(*args) -> Optional[str]:
        try:
            r = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if head else None
    return {"commit": head, "dirty": None if status is None else bool(status)}


def scrub_paths(obj, repo: str, more=()):
    """`obj` (JSON data) with the machine's directories in its strings replaced by placeholders; `more`:
    further (directory, placeholder) pairs (e.g. a corpus folder given on the command line)."""
    places = sorted({(os.path.realpath(repo), "<repo>"), (os.path.abspath(repo), "<repo>"),
                     (os.path.realpath(tempfile.gettempdir()), "<tmp>"), (tempfile.gettempdir(), "<tmp>"),
                     (os.path.expanduser("~"), "<home>"), *more}, key=lambda p: -len(p[0]))
    places = [(path, name) for path, name in places if path not in ("", "/", "~")]

    def scrub(x):
        if isinstance(x, str):
            for path, name in places:
                x = x.replace(path, name)
            return x
        if isinstance(x, dict):
            return {scrub(k): scrub(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [scrub(v) for v in x]
        return x

    return scrub(obj)


def record(res: dict, repo: str, more=()) -> dict:
    """`res` with the commit of `repo` added and the machine's paths scrubbed (`more`: see scrub_paths):
    what a benchmark writes."""
    return scrub_paths({**res, **commit(repo)}, repo, more)
