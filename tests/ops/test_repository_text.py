"""The repository's tracked text stays sane and speaks of the project only.

Over `git ls-files` (files git tracks; skipped outside a git checkout):
- every file without a NUL byte is UTF-8;
- docs and code stay under SIZE_LIMIT bytes and repeat no substantial line more than LINE_REPEAT_LIMIT
  times (the result data under benchmarks/runs/ is excepted: its JSON is what a script wrote);
- no history words (this file excepted, which spells them out): "session" outside pytest's meaning of
  it (a session-scoped fixture, `scope="session"`, once per session: allowed), issue or pull-request
  numbers, "the issue's" (a text the repository does not hold);
- benchmark results name no machine path, every run's JSON names the commit it measured, and run files
  are named after what they hold, not their history;
- every relative link in a tracked .md file reaches a tracked file or folder, and its #anchor a heading
  or an explicit `<a id>` of the target;
- benchmarks/results.csv is well formed and benchmarks/README.md is exactly benchmarks/render.py's output;
- no command decodes sentencepiece twice (fairseq-generate's --remove-bpe/--post-process sentencepiece with a
  --bpe: the words lose their spaces, and the BLEU printed is of glued text);
- README.md stays a front door: at most README_LINE_LIMIT lines (details go to docs/usage.md, the user
  guide, and docs/architecture.md, the internals).
"""
import importlib.util
import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIZE_LIMIT = 200_000            # bytes; the largest source file is about a fifth of this
LINE_REPEAT_LIMIT = 50          # occurrences of one line of >= MIN_REPEATED_LINE characters in one file
MIN_REPEATED_LINE = 40
README_LINE_LIMIT = 170
RESULT_DATA = re.compile(r"^benchmarks/runs/.*\.json$")

SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
# pytest's meaning of the word, the only one allowed
PYTEST_SESSION = re.compile(
    r"scope\s*=\s*[\"']session[\"']|session[- ]scoped|session[- ]wide|session fixtures?|"
    r"(?:once )?per (?:pytest |test )?session|pytest(?:'s)? session|the test session|request\.session",
    re.IGNORECASE)
HISTORY_REFERENCE = [
    re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),          # "issue 11", "issues #3"
    re.compile(r"\b(?:PR|pull request)\s*#?\d+", re.IGNORECASE),
    re.compile(r"(?<![\w&/#\[])#\d+\b"),                      # "#12" in prose (not &#12; or a URL's path)
    re.compile(r"\bthe issue(?:'s|\s+text)\b", re.IGNORECASE),   # "the issue's table": not in the repository
]
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|Users)/")
HISTORY_NAME = re.compile(r"(?:^|[-_])(?:s\d+|session\d*|merged|redraw|rerun|run\d+|rb_\w+|h\d{1,2}[a-z])(?=[-_.]|$)")
MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def tracked():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def text_files():
    """(path, text) of every tracked file without a NUL byte; raises on one that is not UTF-8."""
    for p in tracked():
        data = (ROOT / p).read_bytes()
        if b"\0" in data:
            continue
        yield p, data.decode("utf-8")


def test_text_is_utf8_and_docs_and_code_are_bounded():
    problems = []
    for p, text in text_files():
        if RESULT_DATA.match(p):
            continue
        size = len(text.encode())
        if size > SIZE_LIMIT:
            problems.append(f"{p}: {size} bytes > {SIZE_LIMIT}")
        lines = Counter(line.strip() for line in text.splitlines() if len(line.strip()) >= MIN_REPEATED_LINE)
        if lines:
            line, n = lines.most_common(1)[0]
            if n > LINE_REPEAT_LIMIT:
                problems.append(f"{p}: one line {n} times: {line[:60]!r}")
    assert not problems, "\n".join(problems)


def _session_words(text):
    """(line number, line) of each line with a history word."""
    for lineno, line in enumerate(text.splitlines(), 1):
        allowed = [m.span() for m in PYTEST_SESSION.finditer(line)]
        if any(not any(a <= m.start() < b for a, b in allowed) for m in SESSION.finditer(line)) or any(
                pattern.search(line) for pattern in HISTORY_REFERENCE):
            yield lineno, line.strip()


def test_no_words_about_sessions_or_issue_numbers():
    this_file = Path(__file__).resolve().relative_to(ROOT).as_posix()  # spells the patterns out
    hits = [f"{p}:{n}: {line[:100]}" for p, text in text_files() if p != this_file
            for n, line in _session_words(text)]
    assert not hits, "\n".join(hits)


def test_the_checks_tell_pytest_sessions_from_development_sessions():
    text = ('@pytest.fixture(scope="session")\n"""A data-bin made once per session; session fixtures."""\n'
            "Measured in the third session.\nSee issue 11.\nSee #27.\n"
            "A colour &#35; and a[0] # 1\n")
    assert [n for n, _ in _session_words(text)] == [3, 4, 5]


def test_results_name_no_machine_path_and_no_history():
    problems = []
    for p, text in text_files():
        if not p.startswith("benchmarks/"):
            continue
        if MACHINE_PATH.search(text):
            problems.append(f"{p}: a machine path")
        for part in Path(p).parts[1:]:
            if HISTORY_NAME.search(Path(part).stem):
                problems.append(f"{p}: {part!r} is named by its history")
        if RESULT_DATA.match(p) and not re.fullmatch(r"[0-9a-f]{7,40}", str(json.loads(text).get("commit"))):
            problems.append(f"{p}: no commit of the library it measured")
    assert not problems, "\n".join(problems)
    assert HISTORY_NAME.search("2026-11-30-cpu-benchmark-s6-throughput")
    assert HISTORY_NAME.search("keep-qkv-rb_host2") and HISTORY_NAME.search("h11a_runs")
    assert not HISTORY_NAME.search("activation-bytes-dropout-redrawn") and not HISTORY_NAME.search("2026-11-29-h200-gpu")


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(md_text):
    anchors, seen = set(), Counter()
    fenced = False
    for line in md_text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            slug = _slug(line.lstrip("#"))
            anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    anchors.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", md_text))
    return anchors


def _links(md_text):
    """Link targets outside fenced code blocks and inline code."""
    fenced = False
    for line in md_text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield from MD_LINK.findall(re.sub(r"`[^`]*`", "", line))


def test_relative_markdown_links_resolve():
    files = set(tracked())
    folders = {p.as_posix() for f in files for p in Path(f).parents}
    anchors = {}
    broken = []
    for p in sorted(f for f in files if f.endswith(".md")):
        text = (ROOT / p).read_text(encoding="utf-8")
        for target in _links(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):      # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (ROOT / Path(p).parent / path).resolve() if path else ROOT / p
            dest = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
            if dest not in files and dest not in folders:
                broken.append(f"{p}: {target} (no such tracked file)")
                continue
            if anchor and dest.endswith(".md"):
                if dest not in anchors:
                    anchors[dest] = _anchors((ROOT / dest).read_text(encoding="utf-8"))
                if anchor not in anchors[dest]:
                    broken.append(f"{p}: {target} (no such anchor)")
    assert not broken, "\n".join(broken)


def test_readme_stays_a_front_door():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_LINE_LIMIT, (
        f"README.md has {lines} lines > {README_LINE_LIMIT}: move details to docs/usage.md or docs/architecture.md")


def _render_module():
    spec = importlib.util.spec_from_file_location("benchmarks_render", ROOT / "benchmarks" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_csv_is_well_formed_and_the_readme_is_its_rendering():
    render = _render_module()
    header, rows = render.read_rows()
    assert render.validate(header, rows) == []
    assert rows, "results.csv has no rows"
    assert (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8") == render.render(rows), (
        "benchmarks/README.md is stale: run python benchmarks/render.py")


def test_the_csv_check_rejects_a_bad_row():
    render = _render_module()
    header, rows = render.read_rows()
    good = rows[0]
    bad = [dict(good, id="r999", ratio="9.99"),                          # not ls / fairseq
           dict(good, id="r1000", ls="12 tok"),                          # not a number
           dict(good, id="r1001", status="superseded", superseded_by="r9999"),
           dict(good, id="r1002", run="benchmarks/runs/missing"),
           dict(good, id="r1003", note="/tmp/x.json"),                   # a machine path
           {**good, "id": "r1005", None: ["an extra cell"]}]
    errors = render.validate(header, [*rows, *bad])
    for row in bad:
        assert any(f"({row['id']})" in e or e.startswith(row["id"]) for e in errors), (row["id"], errors)
    live = dict(good, id="r1004")
    if good["status"] in render.LIVE:
        assert any("two live rows" in e for e in render.validate(header, [*rows, live]))


# fairseq-generate's --remove-bpe (--post-process) sentencepiece joins the pieces into words; a --bpe decoder
# then runs on those words too (sentencepiece's deletes every space), on hypotheses and references alike.
REMOVE_SPM = re.compile(r"--(?:remove-bpe|post-process)(?:=|[\s\"',]+)sentencepiece")
BPE_OPTION = re.compile(r"(?<![\w-])--bpe\b")
GENERATE = re.compile(r"fairseq[-_](?:cli\.)?(?:generate|interactive)")


def _commands(path, text):
    """The units a command lives in: a Python file as a whole (its commands are lists over several lines),
    elsewhere each line with its backslash continuations joined (a command: one that runs fairseq-generate or
    fairseq-interactive)."""
    return [text] if path.endswith(".py") else text.replace("\\\n", " ").splitlines()


def _decodes_twice(path, text):
    return [c.strip()[:100] for c in _commands(path, text)
            if GENERATE.search(c) and REMOVE_SPM.search(c) and BPE_OPTION.search(c)]


def test_no_command_decodes_sentencepiece_twice():
    this_file = Path(__file__).resolve().relative_to(ROOT).as_posix()  # spells the pattern out
    found = [f"{p}: {c}" for p, text in text_files() if p != this_file for c in _decodes_twice(p, text)]
    assert not found, "\n".join(found)
    assert _decodes_twice("a.md", "fairseq-generate B --bpe sentencepiece \\\n  --remove-bpe sentencepiece")
    assert _decodes_twice("a.py", '["fairseq_cli.generate", "--post-process", "sentencepiece",\n "--bpe", "x"]')
    assert not _decodes_twice("a.sh", "fairseq-generate B --remove-bpe sentencepiece --eval-bleu-remove-bpe x")
