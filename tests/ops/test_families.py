"""The layering every op family follows (docs/adding_an_op.md): one file per layer, named after the
family, found without any list to edit; no device #ifdef in the op layer."""
import glob
import importlib
import os
import re
import sys

import pytest

import fairseq_lightseq.ops as ops
from fairseq_lightseq.ops import _families, reference

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = [m.__name__.rsplit(".", 1)[1] for m in _families.family_modules(ops)]


def test_the_families():
    assert FAMILIES == ["adam", "attention", "cross_entropy", "dropout", "embedding", "layer_norm",
                        "varlen_attention"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_file_in_every_layer(family):
    expected = [f"fairseq_lightseq/ops/reference/{family}.py", f"csrc/kernels/{family}.h", f"csrc/cpu/{family}.cpp",
                f"csrc/ops/{family}.cpp", f"tests/ops/test_{family}.py"]
    missing = [p for p in expected if not os.path.isfile(os.path.join(REPO, p))]
    assert missing == []
    # attention's CUDA kernels are two files (attention_softmax.cu, attention_heads.cu)
    assert glob.glob(os.path.join(REPO, f"csrc/cuda/{family}*.cu")), f"no csrc/cuda/{family}*.cu"


def test_every_op_layer_file_is_a_family():
    """csrc/ops/*.cpp holds the families and the sublayer blocks (compositions of their ops), nothing else
    that registers ops."""
    names = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(REPO, "csrc/ops/*.cpp"))}
    assert names == set(FAMILIES) | {"blocks"}


def test_no_device_ifdef_in_the_op_layer():
    """The op layer's one build switch is kWithCuda in csrc/ops/device.h; the families compile the same
    in every build."""
    found = {}
    for path in glob.glob(os.path.join(REPO, "csrc/ops/*")):
        with open(path) as f:
            lines = [line.strip() for line in f if re.match(r"\s*#\s*if", line)]
        if lines:
            found[os.path.basename(path)] = lines
    assert found == {"device.h": ["#ifdef FLS_WITH_CUDA"]}


def test_every_cuda_launcher_is_declared_weak():
    """A CPU-only build compiles every csrc/ops/<family>.cpp, whose CUDA implementations call the launchers
    that only the .cu files define: each declaration in a `namespace cuda` of csrc/kernels/ must carry
    FLS_CUDA_LAUNCHER (weak), or the CPU-only library may fail to load (at -O3 the compiler drops the
    unregistered CUDA implementations, so the CPU tests alone would not notice)."""
    plain = []
    for path in sorted(glob.glob(os.path.join(REPO, "csrc/kernels/*.h"))):
        inside = False
        with open(path) as f:
            for line in f:
                if line.startswith("namespace cuda {"):
                    inside = True
                elif line.startswith("}  // namespace cuda"):
                    inside = False
                elif inside and re.match(r"[\w:<>*& ]+\b\w+\(", line) and not line.startswith(
                        ("FLS_CUDA_LAUNCHER ", "inline ", "constexpr ", "//", " ")):
                    plain.append(f"{os.path.basename(path)}: {line.strip()}")
    assert plain == []


def test_the_packages_export_every_family():
    for package in (ops, reference):
        for module in _families.family_modules(package):
            for name in module.__all__:
                assert getattr(package, name) is getattr(module, name), f"{package.__name__}.{name}"
    assert set(ops.FAMILY_EXPORTS) == {n for m in _families.family_modules(ops) for n in m.__all__}


def _package(tmp_path, name, modules):
    """Imports a new package `name` under tmp_path with the modules {module name: source}."""
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_export_families_names_a_module_without_all(tmp_path):
    pkg = _package(tmp_path, "fls_pkg_no_all", {"good": "__all__ = ['f']\ndef f(): pass\n", "bad": "def g(): pass\n"})
    with pytest.raises(ImportError, match=r"fls_pkg_no_all\.bad must list its public names in __all__"):
        _families.export_families(pkg)


def test_export_families_names_both_owners_of_a_name(tmp_path):
    pkg = _package(tmp_path, "fls_pkg_twice", {"a": "__all__ = ['f']\ndef f(): pass\n",
                                               "b": "__all__ = ['f']\ndef f(): pass\n", "_private": ""})
    with pytest.raises(ImportError, match=r"fls_pkg_twice\.f is exported by both fls_pkg_twice\.a and "
                                          r"fls_pkg_twice\.b"):
        _families.export_families(pkg)


def test_export_families_sets_the_names(tmp_path):
    pkg = _package(tmp_path, "fls_pkg_ok", {"a": "__all__ = ['f']\ndef f(): return 1\ndef helper(): pass\n",
                                            "_private": "__all__ = ['h']\ndef h(): pass\n"})
    assert set(_families.export_families(pkg)) == {"f"}
    assert pkg.f() == 1 and not hasattr(pkg, "h") and not hasattr(pkg, "helper")
