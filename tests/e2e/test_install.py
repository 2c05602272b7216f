"""pip: the project installs into an environment that already has torch and fairseq (here
fairseq-fixed) without fetching another fairseq or torch, builds a wheel holding the package and its
compiled library, and that wheel works in a second environment, from outside the source tree.

The second environment is a throwaway venv that reuses this venv's packages (a .pth file naming this
venv's site-packages), so nothing is downloaded. Building the wheel compiles the extension in the
tree's build/ directory: after the in-place build (`make build`, the same objects) ninja has nothing
left to compile and the module takes about half a minute; from a clean tree it compiles everything
(minutes on 2 cores). Marked `e2e`."""
import glob
import json
import os
import site
import subprocess
import sys
import time
import zipfile

import pytest

from support import ROOT
from support.cli import env

pytestmark = pytest.mark.e2e


def pip(*args, cwd, python=sys.executable, timeout=1800):
    r = subprocess.run([python, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def test_install_needs_nothing_but_the_project(tmp_path):
    """The README's install line, as a dry run without any index: pip resolves every requirement from
    the environment (fairseq is not one; torch is satisfied by the installed torch)."""
    report = tmp_path / "report.json"
    pip("install", "--dry-run", "--no-build-isolation", "--no-index", "--report", str(report), ROOT, cwd=str(tmp_path))
    installs = json.loads(report.read_text())["install"]
    assert [i["metadata"]["name"] for i in installs] == ["fairseq_lightseq"], installs
    requires = installs[0]["metadata"].get("requires_dist", [])
    assert not any(r.split()[0].lower().startswith("fairseq") for r in requires), requires
    assert any(r.replace(" ", "").startswith("torch>=") for r in requires), requires


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    start = time.time()
    pip("wheel", "--no-build-isolation", "--no-deps", "-w", str(out), ROOT, cwd=str(out))
    print(f"pip wheel took {time.time() - start:.0f} s")
    (path,) = glob.glob(str(out / "fairseq_lightseq-*.whl"))
    return path


def test_wheel_holds_package_and_compiled_library(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("fairseq_lightseq/__init__.py", "fairseq_lightseq/models/__init__.py",
                 "fairseq_lightseq/optim/ls_adam.py", "fairseq_lightseq/ops/_backend.py"):
        assert name in names, name
    assert any(n.startswith("fairseq_lightseq/_C") and n.endswith(".so") for n in names), names
    assert not any(n.startswith(("tests/", "csrc/", "scripts/")) for n in names)


@pytest.fixture(scope="module")
def second_venv(wheel, tmp_path_factory):
    """A new venv that sees this venv's packages (torch, fairseq-fixed) through a .pth file, with the
    wheel installed into its own site-packages; returns (its python, a working directory outside the tree)."""
    root = tmp_path_factory.mktemp("venv2")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = str(root / "venv" / "bin" / "python")
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(own, "reuse_main_venv.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    pip("install", "--no-deps", "--no-index", wheel, cwd=str(root), python=python)
    work = root / "work"
    work.mkdir()
    return python, str(work), own


def test_info_runs_from_the_installed_wheel(second_venv):
    python, work, own = second_venv
    r = subprocess.run([python, "-m", "fairseq_lightseq.info"], cwd=work, capture_output=True, text=True,
                       timeout=300, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"compiled library  {own}/fairseq_lightseq/_C" in r.stdout, r.stdout
    assert "fairseq           0.12" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(("layer_norm ", "adam_step "))]
    assert rows and all(row[1] == "compiled" for row in rows), r.stdout


def test_registrations_import_from_the_installed_wheel(second_venv):
    python, work, own = second_venv
    code = ("import fairseq_lightseq.models, fairseq_lightseq\n"
            "from fairseq.models import ARCH_MODEL_REGISTRY\n"
            "from fairseq.criterions import CRITERION_REGISTRY\n"
            "from fairseq.optim import OPTIMIZER_REGISTRY\n"
            "assert 'ls_transformer_vaswani_wmt_en_de_big' in ARCH_MODEL_REGISTRY\n"
            "assert 'ls_label_smoothed_cross_entropy' in CRITERION_REGISTRY and 'ls_adam' in OPTIMIZER_REGISTRY\n"
            "print(fairseq_lightseq.__file__)")
    r = subprocess.run([python, "-c", code], cwd=work, capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == f"{own}/fairseq_lightseq/__init__.py"
