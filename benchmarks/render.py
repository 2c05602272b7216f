"""Check benchmarks/results.csv and write benchmarks/README.md from it (standard library only).

    python benchmarks/render.py           # rewrite benchmarks/README.md
    python benchmarks/render.py --check   # exit 1 if the CSV is malformed or the README is not its rendering

results.csv is the one place a measured figure is written down; everything else (the top README,
docs/, examples/) cites a row as `[r12](benchmarks/README.md#r12)`. A new measurement is a new row
with the next id; the row it replaces gets `status` superseded and `superseded_by` the new id.
"""
import csv
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSV_PATH = HERE / "results.csv"
README_PATH = HERE / "README.md"

COLUMNS = ["id", "date", "commit", "machine", "load", "family", "mode", "shape", "metric", "unit",
           "ls", "fairseq", "fairseq_fused_adamw", "ratio", "ratio_fused_adamw", "status",
           "superseded_by", "run", "note"]
FAMILIES = {"translation": "Translation (`ls_transformer*`)",
            "lm": "Language model (`ls_transformer_lm*`)",
            "roberta": "RoBERTa (`ls_roberta*`)",
            "bart": "BART / mBART (`ls_bart*`, `ls_mbart*`)",
            "kernels": "CUDA kernels on the emulated device (`make test-cuda-emulated`)"}
MODES = ["throughput", "packed", "host time", "saved bytes", "op", "decoding", "quality", "sequence parallel",
         "emulation"]
STATUSES = {
    "current": "the latest measurement of this figure, on code that still behaves as measured",
    "changed": "the latest measurement, but the code has changed since in a way that may move it (the note says how)",
    "superseded": "replaced by the row named in `superseded_by`",
    "withdrawn": "the method was wrong (the note says why): do not quote",
}
LIVE = ("current", "changed")
VALUE_COLUMNS = ["ls", "fairseq", "fairseq_fused_adamw", "ratio", "ratio_fused_adamw"]
# a value cell: empty, or numbers joined by " / " (one per variant the shape names, in its order)
NUMBER = re.compile(r"-?\d+(\.\d+)?")
MACHINE_PATH = re.compile(r"(^|[\s\"'(])/(work|tmp|home|root|Users)/")
RATIO_TOLERANCE = 0.02  # relative: ratios come from unrounded JSON values or per-step medians


def read_rows(path=CSV_PATH):
    """The CSV as (header, list of row dicts), in file order."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)  # a short row gets None values, a long one a None key
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _numbers(cell):
    return [float(p) for p in cell.split(" / ")] if cell else []


def _check_values(r, say):
    counts = {}
    for c in VALUE_COLUMNS:
        parts = r[c].split(" / ") if r[c] else []
        if any(not NUMBER.fullmatch(p) for p in parts):
            say(f"{c} {r[c]!r} is not numbers joined by ' / '")
            return
        counts[c] = len(parts)
    given = {n for n in counts.values() if n}
    if len(given) > 1:
        say(f"value columns disagree on the number of variants: {counts}")
        return
    for num, ratio in (("fairseq", "ratio"), ("fairseq_fused_adamw", "ratio_fused_adamw")):
        if r["ls"] and r[num] and r[ratio]:
            for a, b, q in zip(_numbers(r["ls"]), _numbers(r[num]), _numbers(r[ratio])):
                if b == 0 or not math.isclose(a / b, q, rel_tol=RATIO_TOLERANCE, abs_tol=0.006):
                    say(f"{ratio} {q} is not ls / {num} = {a} / {b}")


def validate(header, rows, root=HERE.parent):
    """Every problem of the table as one line each (empty when the table is well formed)."""
    errors = []
    if header != COLUMNS:
        errors.append(f"header {header} != {COLUMNS}")
        return errors
    ids = {}
    for n, r in enumerate(rows, 2):
        def say(msg, r=r, n=n):
            errors.append(f"results.csv line {n} ({r.get('id')}): {msg}")
        if None in r or None in r.values():
            say("wrong number of cells")
            continue
        if not re.fullmatch(r"r[1-9]\d*", r["id"]) or r["id"] in ids:
            say("id must be r<number>, unique")
        ids[r["id"]] = r
        if not re.fullmatch(r"20\d\d-[01]\d-[0-3]\d", r["date"]):
            say(f"date {r['date']!r} is not YYYY-MM-DD")
        if not re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]):
            say(f"commit {r['commit']!r} is not a git hash")
        if r["family"] not in FAMILIES:
            say(f"family {r['family']!r} not in {sorted(FAMILIES)}")
        if r["mode"] not in MODES:
            say(f"mode {r['mode']!r} not in {MODES}")
        if r["status"] not in STATUSES:
            say(f"status {r['status']!r} not in {sorted(STATUSES)}")
        for c in ("machine", "load", "shape", "metric", "unit", "run"):
            if not r[c]:
                say(f"{c} is empty")
        if not (r["ls"] or r["ratio"]):
            say("neither ls nor ratio given")
        _check_values(r, say)
        if any(MACHINE_PATH.search(v) for v in r.values()):
            say("a cell names a machine path")
        if not (root / r["run"]).exists():
            say(f"run {r['run']!r} does not exist")
    live = {}
    for r in rows:
        if r["status"] == "superseded":
            by = ids.get(r["superseded_by"])
            if by is None or by["status"] == "superseded" or (by["family"], by["metric"]) != (r["family"], r["metric"]):
                errors.append(f"{r['id']}: superseded_by {r['superseded_by']!r} must name a later row of the same figure")
        elif r["superseded_by"]:
            errors.append(f"{r['id']}: superseded_by given but status is {r['status']}")
        if r["status"] in LIVE:
            key = (r["family"], r["mode"], r["shape"], r["metric"])
            if key in live:
                errors.append(f"{r['id']} and {live[key]}: two live rows of one figure {key}")
            live[key] = r["id"]
    return errors


def _cell(text):
    return text.replace("|", "\\|")


def _values(r):
    cols = [r["ls"], r["fairseq"], r["fairseq_fused_adamw"]]
    ratio = r["ratio"] + (f"; fused {r['ratio_fused_adamw']}" if r["ratio_fused_adamw"] else "")
    return [c if c else "" for c in cols] + [ratio]


def render(rows):
    """benchmarks/README.md as a string."""
    machines = sorted({r["machine"] for r in rows})
    out = [
        "# Measured results",
        "",
        "<!-- Generated by benchmarks/render.py from benchmarks/results.csv: edit the CSV, then run",
        "     `python benchmarks/render.py`. -->",
        "",
        "Every figure the documentation quotes is one row of [results.csv](results.csv), cited by its id",
        "(`[r12](benchmarks/README.md#r12)`). Each row names the date, the commit the library was measured on,",
        "the machine and its load, and the run folder under [runs/](runs/) that holds the raw JSON and the",
        "notes (method, commands, what the numbers mean). **ratio** is always ls / fairseq (above 1 is",
        "faster for a speed, below 1 is less for a time or a size); \"fused\" is against fairseq with torch's",
        "fused AdamW instead of fairseq's adam. A cell with `a / b` holds one value per variant the row's",
        "*what* names, in its order.",
        "",
        "| status | meaning |",
        "|---|---|",
    ]
    out += [f"| {s} | {m} |" for s, m in STATUSES.items()]
    out += ["", "Machines: " + "; ".join(machines) + ". CPU ratios at 2 threads need an idle machine:",
            "another process on the second core makes every parallel region wait a scheduler time slice."]
    for fam, title in FAMILIES.items():
        fam_rows = [r for r in rows if r["family"] == fam]
        out += ["", f"## {title}"]
        for mode in MODES:
            mrows = [r for r in fam_rows if r["mode"] == mode]
            if not mrows:
                continue
            out += ["", f"### {title.split(' (')[0]}: {mode}", "",
                    "| id | date | what | unit | ls | fairseq | fairseq + fused AdamW | ratio | status | run, commit, load | note |",
                    "|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in mrows:
                status = r["status"] + (f" by [{r['superseded_by']}](#{r['superseded_by']})" if r["superseded_by"] else "")
                run = r["run"]
                # links relative to benchmarks/; a run under runs/ is named without the prefix
                link = run[len("benchmarks/"):] if run.startswith("benchmarks/") else "../" + run
                name = run[len("benchmarks/runs/"):] if run.startswith("benchmarks/runs/") else run
                what = f"{r['shape']}: {r['metric']}"
                cells = [f'<a id="{r["id"]}"></a>{r["id"]}', r["date"], what, r["unit"], *_values(r), status,
                         f"[{name}]({link}), `{r['commit']}`, {r['load']}", r["note"]]
                out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def main(argv):
    header, rows = read_rows()
    errors = validate(header, rows)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    text = render(rows)
    if "--check" in argv:
        if README_PATH.read_text(encoding="utf-8") != text:
            print("benchmarks/README.md is not results.csv's rendering: run python benchmarks/render.py",
                  file=sys.stderr)
            return 1
        return 0
    README_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
