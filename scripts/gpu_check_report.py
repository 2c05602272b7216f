"""report.md and summary.json of scripts/gpu_check.sh (docs/gpu_check.md), and their validation.

    python scripts/gpu_check_report.py write LOGS OUT_DIR --profile P --budget S --reserve S --rehearsal 0|1
    python scripts/gpu_check_report.py validate OUT_DIR      # the rehearsal's last step; exit 1 on a problem

gpu_check.sh appends one line per step to LOGS/steps.tsv, ran or skipped, in the order of its plan:
name, profile, status (ok | failed | timeout | skipped), rc, seconds, limit_s, cap_s, min_s, start_s
(seconds since the script started), reason. `write` turns that file and the steps' logs (LOGS/NAME.txt)
into OUT_DIR/report.md and OUT_DIR/summary.json; gpu_check.sh calls it after every step, so a run cut
short still leaves both. Standard library only (it runs on the GPU machine's bare Python).
"""
import argparse
import json
import os
import sys
import time

FIELDS = ["name", "profile", "status", "rc", "seconds", "limit_s", "cap_s", "min_s", "start_s", "reason"]
INTS = {"rc", "seconds", "limit_s", "cap_s", "min_s", "start_s"}
STATUSES = {"ok", "failed", "timeout", "skipped"}
FIRST_CALL_MAX_S = 480  # the first call's budget on the H200: 8 minutes, build included
PYTEST_LINES = ("FAILED", "ERROR", "passed", "failed", "error", "collected", "no tests ran")


def read_steps(logs: str) -> list:
    rows = []
    path = os.path.join(logs, "steps.tsv")
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            vals = line.rstrip("\n").split("\t")
            row = dict(zip(FIELDS, vals + [""] * (len(FIELDS) - len(vals))))
            for k in INTS:
                row[k] = int(row[k]) if row[k] not in ("", "-") else None
            rows.append(row)
    return rows


def guaranteed(steps: list, budget: int, reserve: int) -> list:
    """The leading steps whose caps fit the budget together: these run to their caps whatever the
    others take; later ones get what is left."""
    out, total = [], 0
    for s in steps:
        total += s["cap_s"] or 0
        if total > budget - reserve:
            break
        out.append(s["name"])
    return out


def summary(steps, profile, budget, reserve, rehearsal, elapsed) -> dict:
    return {"profile": profile, "rehearsal": bool(rehearsal), "budget_s": budget, "reserve_s": reserve,
            "elapsed_s": elapsed, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "guaranteed_steps": guaranteed(steps, budget, reserve),
            "skipped": [s["name"] for s in steps if s["status"] == "skipped"],
            "not_ok": [s["name"] for s in steps if s["status"] in ("failed", "timeout")],
            "steps": steps}


def log_excerpt(logs: str, name: str) -> str:
    path = os.path.join(logs, name + ".txt")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return ""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    if any("pytest" in line for line in lines[:3]) or name.startswith("tests"):
        picked = [line for line in lines if line.startswith(PYTEST_LINES[:2]) or
                  any(w in line for w in PYTEST_LINES[2:])]
        lines = picked or lines
    return "\n".join(lines[-60:])


def write(a) -> None:
    steps = read_steps(a.logs)
    s = summary(steps, a.profile, a.budget, a.reserve, a.rehearsal, a.elapsed)
    with open(os.path.join(a.out_dir, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    kind = "REHEARSAL (no GPU; command lines only, nothing measured)" if a.rehearsal else "GPU check"
    md = [f"# {kind}, profile {a.profile}, {s['date']}", "",
          f"Budget {a.budget} s from the script's start ({a.reserve} s of it kept for this report); "
          f"{a.elapsed} s used. Skipped: {', '.join(s['skipped']) or 'none'}. "
          f"Failed or cut: {', '.join(s['not_ok']) or 'none'}.", "",
          "| step | profile | status | rc | seconds | limit s | cap s | min s | at s | note |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in steps:
        md.append("| " + " | ".join("" if r[k] is None else str(r[k]) for k in
                                    ("name", "profile", "status", "rc", "seconds", "limit_s", "cap_s", "min_s",
                                     "start_s", "reason")) + " |")
    for r in steps:
        text = log_excerpt(a.logs, r["name"])
        if text:
            md += ["", f"## {r['name']}", "```", text, "```"]
    with open(os.path.join(a.out_dir, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def validate(out_dir: str) -> list:
    """Problems with a finished run's files (empty when none)."""
    problems = []
    try:
        with open(os.path.join(out_dir, "summary.json")) as f:
            s = json.load(f)
        with open(os.path.join(out_dir, "report.md")) as f:
            report = f.read()
    except (OSError, ValueError) as e:
        return [f"cannot read summary.json/report.md: {e}"]
    budget, reserve, steps = s["budget_s"], s["reserve_s"], s["steps"]
    if not steps:
        problems.append("no steps recorded")
    for r in steps:
        if r["status"] not in STATUSES:
            problems.append(f"{r['name']}: status {r['status']!r}")
        if f"| {r['name']} |" not in report:
            problems.append(f"{r['name']}: not in report.md")
        if r["status"] != "skipped" and r["start_s"] + r["limit_s"] > budget - reserve:
            problems.append(f"{r['name']}: limit {r['limit_s']} s from {r['start_s']} s passes the budget")
        if r["status"] != "skipped" and r["limit_s"] > r["cap_s"]:
            problems.append(f"{r['name']}: limit {r['limit_s']} s over its cap {r['cap_s']} s")
    if s["elapsed_s"] > budget:
        problems.append(f"elapsed {s['elapsed_s']} s > budget {budget} s")
    if s["profile"] == "first" and budget > FIRST_CALL_MAX_S:
        problems.append(f"first call's budget {budget} s > {FIRST_CALL_MAX_S} s")
    if s["profile"] == "first" and budget == FIRST_CALL_MAX_S and "benchmark" not in s["guaranteed_steps"]:
        problems.append("the steady-state benchmark is not within the caps that fit the budget")
    for name in os.listdir(out_dir):
        if name.endswith(".json") and name != "summary.json":
            try:
                with open(os.path.join(out_dir, name)) as f:
                    stub = json.load(f)
                if s["rehearsal"] and not stub.get("rehearsal"):
                    problems.append(f"{name}: not marked as a rehearsal")
            except ValueError as e:
                problems.append(f"{name}: {e}")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("logs")
    w.add_argument("out_dir")
    w.add_argument("--profile", required=True)
    w.add_argument("--budget", type=int, required=True)
    w.add_argument("--reserve", type=int, required=True)
    w.add_argument("--elapsed", type=int, required=True)
    w.add_argument("--rehearsal", type=int, default=0)
    v = sub.add_parser("validate")
    v.add_argument("out_dir")
    a = p.parse_args(argv)
    if a.cmd == "write":
        write(a)
        return 0
    problems = validate(a.out_dir)
    for x in problems:
        print("gpu_check validate:", x, file=sys.stderr)
    print(f"gpu_check validate: {'OK' if not problems else f'{len(problems)} problem(s)'} ({a.out_dir})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
