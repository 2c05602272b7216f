"""scripts/gpu_check.sh rehearsed on the CPU (GPU_CHECK_REHEARSE=1, docs/gpu_check.md): the first call's
every step checks its exact command line (pytest --collect-only collects tests, the scripts' --check-args
accept their arguments) and the files it leaves (report.md, summary.json, the stub JSONs) are
well-formed; the first call's caps up to the steady-state benchmark fit 8 minutes; the second call's and
the on-request rows parse too; with a tiny budget the script skips what does not fit, says so, and ends
within the budget. Marked `e2e`; about a minute of CPU in all (59 s user+sys measured on 2 busy cores)."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from support import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")
from scripts import gpu_check_report  # noqa: E402

FIRST_CALL_S = 480


def rehearse(out, **env):
    e = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_REHEARSE="1", PYTHONWARNINGS="ignore", **env)
    for k in ("GPU_CHECK_PROFILE", "GPU_CHECK_ONLY", "GPU_CHECK_BUDGET"):
        if k not in env:
            e.pop(k, None)
    t0 = time.monotonic()
    r = subprocess.run(["bash", SCRIPT, str(out)], capture_output=True, text=True, timeout=300, env=e)
    summary = json.loads((out / "summary.json").read_text())
    return r, summary, time.monotonic() - t0


def table_rows():
    """The step table of gpu_check.sh: [(name, profile, min_s, cap_s, kind)]."""
    text = open(SCRIPT).read()
    table = text.split("\nSTEPS='\n", 1)[1].split("\n'\n", 1)[0]
    return [tuple(line.split()[:5]) for line in table.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def first_call(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_first")
    r, summary, _ = rehearse(out)
    assert r.returncode == 0, f"rehearsal failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return out, summary


def test_first_call_rehearsal_runs_every_step_and_leaves_valid_files(first_call):
    out, s = first_call
    assert gpu_check_report.validate(str(out)) == []
    assert s["rehearsal"] and s["profile"] == "first" and s["budget_s"] == FIRST_CALL_S
    names = [x["name"] for x in s["steps"]]
    first = [row[0] for row in table_rows() if row[1] == "first"]
    assert names == ["machine", "wheels", "build", "info"] + first
    assert all(x["status"] == "ok" for x in s["steps"] if x["name"] != "wheels"), s["steps"]
    report = (out / "report.md").read_text()
    assert report.startswith("# REHEARSAL") and all(f"| {n} |" in report for n in names)
    stub = json.loads((out / "benchmark.json").read_text())
    assert stub["rehearsal"] and "--precision" in stub["argv"] and "--check-args" in stub["argv"]
    assert (out / "logs.tgz").stat().st_size > 0


def test_first_call_caps_up_to_the_benchmark_fit_eight_minutes(first_call):
    _, s = first_call
    caps = []
    for x in s["steps"]:
        caps.append(x["cap_s"])
        if x["name"] == "benchmark":
            break
    assert sum(caps) <= FIRST_CALL_S - s["reserve_s"], caps
    assert "benchmark" in s["guaranteed_steps"]
    for x in s["steps"]:  # each step's deadline is inside the budget
        if x["status"] != "skipped":
            assert x["start_s"] + x["limit_s"] <= s["budget_s"] - s["reserve_s"]


def test_pytest_steps_collect_tests(first_call):
    out, s = first_call
    import tarfile
    with tarfile.open(out / "logs.tgz") as t:
        for name in ("tests_new", "tests_rest"):
            log = t.extractfile(f"./{name}.txt").read().decode()
            n = int(re.search(r"^(\d+)(/\d+)? tests? collected", log, re.M).group(1))
            assert n > 0, log[-2000:]


def test_second_call_and_on_request_rows_parse(tmp_path):
    names = [row[0] for row in table_rows() if row[1] in ("second", "only")]
    assert names
    r, s, _ = rehearse(tmp_path, GPU_CHECK_ONLY=" ".join(names))
    assert r.returncode == 0, f"rehearsal failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    ran = {x["name"]: x["status"] for x in s["steps"]}
    assert all(ran[n] == "ok" for n in names), ran
    assert gpu_check_report.validate(str(tmp_path)) == []


def test_tiny_budget_skips_what_does_not_fit_and_ends_within_it(tmp_path):
    budget = 45
    r, s, wall = rehearse(tmp_path, GPU_CHECK_BUDGET=str(budget))
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert wall <= budget + 10  # the report and validation after the last step
    assert s["budget_s"] == budget and s["elapsed_s"] <= budget
    status = {x["name"]: x for x in s["steps"]}
    assert set(status) >= {"tests_new", "benchmark", "tests_rest", "bench_criterion", "bench_optimizer"}
    for name in ("tests_new", "benchmark", "tests_rest"):
        assert status[name]["status"] == "skipped" and "budget" in status[name]["reason"], status[name]
    assert set(s["skipped"]) >= {"tests_new", "benchmark", "tests_rest"}
    report = (tmp_path / "report.md").read_text()
    assert "Skipped:" in report and "benchmark" in report.split("Skipped:", 1)[1].splitlines()[0]
    assert gpu_check_report.validate(str(tmp_path)) == []
