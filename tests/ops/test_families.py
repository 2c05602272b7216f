"""The layout rules as tests. The layering every op group follows (docs/adding_an_op.md): one file per
layer, named after the group, found without any list to edit; no device #ifdef in the op layer. And the
package's rooms (docs/architecture.md): what the package root holds, no import up the layers, no private
name used outside its file (or a private module outside its package), every patch through one helper."""
import glob
import importlib
import os
import re
import sys

import pytest

import fairseq_lightseq.ops as ops
from fairseq_lightseq.ops import _groups, reference

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OP_GROUPS = [m.__name__.rsplit(".", 1)[1] for m in _groups.op_group_modules(ops)]


def test_the_op_groups():
    assert OP_GROUPS == ["adam", "attention", "cross_entropy", "dropout", "embedding", "layer_norm",
                         "varlen_attention"]


@pytest.mark.parametrize("group", OP_GROUPS)
def test_every_op_group_has_a_file_in_every_layer(group):
    expected = [f"fairseq_lightseq/ops/reference/{group}.py", f"csrc/kernels/{group}.h", f"csrc/cpu/{group}.cpp",
                f"csrc/ops/{group}.cpp", f"tests/ops/test_{group}.py"]
    missing = [p for p in expected if not os.path.isfile(os.path.join(REPO, p))]
    assert missing == []
    # attention's CUDA kernels are two files (attention_softmax.cu, attention_heads.cu)
    assert glob.glob(os.path.join(REPO, f"csrc/cuda/{group}*.cu")), f"no csrc/cuda/{group}*.cu"


def test_every_op_layer_file_is_an_op_group():
    """csrc/ops/*.cpp holds the op groups and the sublayer blocks (compositions of their ops), nothing else
    that registers ops."""
    names = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(REPO, "csrc/ops/*.cpp"))}
    assert names == set(OP_GROUPS) | {"blocks"}


def test_no_device_ifdef_in_the_op_layer():
    """The op layer's one build switch is kWithCuda in csrc/ops/device.h; the op groups compile the same
    in every build."""
    found = {}
    for path in glob.glob(os.path.join(REPO, "csrc/ops/*")):
        with open(path) as f:
            lines = [line.strip() for line in f if re.match(r"\s*#\s*if", line)]
        if lines:
            found[os.path.basename(path)] = lines
    assert found == {"device.h": ["#ifdef FLS_WITH_CUDA"]}


def test_every_cuda_launcher_is_declared_weak():
    """A CPU-only build compiles every csrc/ops/<group>.cpp, whose CUDA implementations call the launchers
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


def test_the_packages_export_every_op_group():
    for package, modules in ((ops, _groups.op_group_modules(ops)), (reference, _groups.public_modules(reference))):
        for module in modules:
            for name in module.__all__:
                assert getattr(package, name) is getattr(module, name), f"{package.__name__}.{name}"
    assert set(ops.OP_GROUP_EXPORTS) == {n for m in _groups.op_group_modules(ops) for n in m.__all__}


def test_the_public_modules_of_ops_are_the_op_groups_the_dropout_stream_and_flash_attention():
    # flash_attention wraps torch's own flash kernels (no kernels of ours on either device): not an op group
    public = {m.__name__.rsplit(".", 1)[1] for m in _groups.public_modules(ops)}
    assert public == set(OP_GROUPS) | {"dropout_stream", "flash_attention"}


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


def _export(pkg):
    return _groups.export_all(pkg, _groups.public_modules(pkg))


def test_export_all_names_a_module_without_all(tmp_path):
    pkg = _package(tmp_path, "fls_pkg_no_all", {"good": "__all__ = ['f']\ndef f(): pass\n", "bad": "def g(): pass\n"})
    with pytest.raises(ImportError, match=r"fls_pkg_no_all\.bad must list its public names in __all__"):
        _export(pkg)


def test_export_all_names_both_owners_of_a_name(tmp_path):
    pkg = _package(tmp_path, "fls_pkg_twice", {"a": "__all__ = ['f']\ndef f(): pass\n",
                                               "b": "__all__ = ['f']\ndef f(): pass\n", "_private": ""})
    with pytest.raises(ImportError, match=r"fls_pkg_twice\.f is exported by both fls_pkg_twice\.a and "
                                          r"fls_pkg_twice\.b"):
        _export(pkg)


def test_export_all_sets_the_names(tmp_path):
    pkg = _package(tmp_path, "fls_pkg_ok", {"a": "__all__ = ['f']\ndef f(): return 1\ndef helper(): pass\n",
                                            "_private": "__all__ = ['h']\ndef h(): pass\n"})
    assert set(_export(pkg)) == {"f"}
    assert pkg.f() == 1 and not hasattr(pkg, "h") and not hasattr(pkg, "helper")


# ---- the package's rooms -------------------------------------------------------------------------
PACKAGE = os.path.join(REPO, "fairseq_lightseq")
# The package root: its `python -m` entry points, the compiled library, and the rooms.
ROOT_FILES = {"__init__.py", "info.py", "export_ctranslate2.py", "errors.py"}
ROOMS = {"checkpoints", "criterions", "demo", "models", "modules", "ops", "optim", "patches", "sequence_parallel"}
# Layers, lowest first: a module may import from its own room and the rooms of lower layers only.
# The root's modules (the entry points) sit on top, but errors.py (the refusals every layer raises) at the bottom.
LAYERS = [{"errors"}, {"ops"}, {"sequence_parallel"}, {"modules"}, {"criterions", "optim"}, {"models"}, {"checkpoints"},
          {"patches"}, {"demo", ""}]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _modules():
    """{dotted module name: path} of every .py file of the package."""
    found = {}
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, REPO)[:-3].split(os.sep)
        if rel[-1] == "__init__":
            rel = rel[:-1]
        found[".".join(rel)] = path
    return found


def _imports(name: str, path: str):
    """(imported module, imported names) for every import of the package's own modules in `path`
    (module `name`), relative imports resolved; names is () for `import x`."""
    import ast

    is_package = path.endswith("__init__.py")
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fairseq_lightseq"):
                    yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("fairseq_lightseq"):
                yield module, tuple(a.name for a in node.names)


def _room(module: str) -> str:
    if module == "fairseq_lightseq.errors":
        return "errors"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOMS) else ""


def test_the_package_root_holds_only_the_entry_points_and_the_rooms():
    built = ("_C", "_cuda_emulated")  # the compiled library; the emulated CUDA device's (a test build)
    entries = {e for e in os.listdir(PACKAGE) if e != "__pycache__" and not (e.startswith(built) and e.endswith(".so"))}
    assert entries == ROOT_FILES | ROOMS


def test_the_package_lists_its_public_names():
    import fairseq_lightseq

    assert set(fairseq_lightseq.__all__) == {"__version__", "checkpoints", "criterions", "models", "ops", "optim",
                                             "patches"}
    assert all(hasattr(fairseq_lightseq, name) for name in fairseq_lightseq.__all__)


def test_every_room_has_a_layer():
    assert set(LAYER) == ROOMS | {"", "errors"}


def test_no_import_goes_up_the_layers():
    up = []
    for name, path in _modules().items():
        for module, _ in _imports(name, path):
            if module in ("fairseq_lightseq", "fairseq_lightseq._C") and not _room(name) == "":
                continue  # the package itself (importing it applies the patches) and the compiled library
            if LAYER[_room(module)] > LAYER[_room(name)]:
                up.append(f"{name} -> {module}")
    assert up == []


def test_no_private_name_is_imported_from_another_file():
    """A name starting with "_" is used in its own file only; a module starting with "_" by its own package
    (and its subpackages) only. The one exception: ops/_backend.py loads the compiled library _C."""
    found = []
    for name, path in _modules().items():
        for module, names in _imports(name, path):
            private_module = [p for p in module.split(".") if p.startswith("_")]
            if private_module and module != "fairseq_lightseq._C":
                owner = module[: module.index("." + private_module[0])]
                if not name.startswith(owner + ".") and name != owner:
                    found.append(f"{name} imports {module}")
            for n in names:
                if n.startswith("_") and not (n == "_C" and name == "fairseq_lightseq.ops._backend"):
                    package_of_name = module
                    inside = name == package_of_name or name.startswith(package_of_name + ".")
                    if not inside or not _is_module(f"{module}.{n}"):
                        found.append(f"{name} imports {n} from {module}")
    assert found == []


def _is_module(dotted: str) -> bool:
    return dotted in _modules()


def test_nothing_outside_ops_reaches_a_private_ops_name():
    """Outside ops/ (the package and scripts/), no `ops._x` or `_backend` in the source."""
    found = []
    for path in glob.glob(os.path.join(REPO, "fairseq_lightseq", "**", "*.py"), recursive=True) + \
            glob.glob(os.path.join(REPO, "scripts", "**", "*.py"), recursive=True):
        if os.sep + "ops" + os.sep in path:
            continue
        text = open(path).read()
        for match in re.finditer(r"\bops\._\w+|\b_backend\b|\b_groups\b", text):
            found.append(f"{os.path.relpath(path, REPO)}: {match.group(0)}")
    assert found == []


def test_every_patch_goes_through_the_wrap_helper():
    """In patches/ and checkpoints/, no assignment to an imported module's attribute but in wrap.py; every
    patch has an
    idempotent install(), listed in patches.ORDER with requirements first."""
    import ast

    from fairseq_lightseq import patches
    from fairseq_lightseq.patches import wrap

    direct = []
    for path in glob.glob(os.path.join(PACKAGE, "patches", "*.py")) + glob.glob(os.path.join(PACKAGE, "checkpoints", "*.py")):
        if path.endswith("wrap.py"):
            continue
        tree = ast.parse(open(path).read())
        modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                   for a in n.names}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules:
                    direct.append(f"{os.path.basename(path)}: {t.value.id}.{t.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and \
                    isinstance(node.args[0], ast.Name) and node.args[0].id in modules:
                direct.append(f"{os.path.basename(path)}: setattr({node.args[0].id}, ...)")
    assert direct == []
    names = [module.rsplit(".", 1)[1] for module, _ in patches.ORDER]
    assert names == ["requirements", "numpy_compat", "safety", "checkpoint_io", "cli_config", "cpu_ddp", "clean_exit",
                     "refusal_exit", "batch_seeds", "pretrained_bart_task", "resume_batches",
                     "denoising_noise"]

    def current(key):
        """What is in place at "module.name" or "module.Class.name" (a class's own attribute)."""
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            try:
                owner = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:-1]:
                owner = getattr(owner, attr)
            return owner.__dict__[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
        raise AssertionError(key)

    patched = {key: current(key) for key in wrap.PATCHED}
    patches.install()  # a second install changes nothing
    assert {key: current(key) for key in wrap.PATCHED} == patched
    assert {"fairseq.checkpoint_utils.load_checkpoint_to_cpu", "fairseq.checkpoint_utils.torch_persistent_save",
            "fairseq.checkpoint_utils.PathManager", "fairseq.distributed.utils.call_main",
            "fairseq.models.distributed_fairseq_model.DistributedDataParallel", "sys.excepthook",
            "fairseq.trainer.Trainer.train_step", "fairseq.tasks.fairseq_task.FairseqTask.get_batch_iterator"} <= set(
                wrap.PATCHED)


def test_the_version_is_written_once():
    import fairseq_lightseq

    with open(os.path.join(REPO, "pyproject.toml")) as f:
        text = f.read()
    assert 'version = {attr = "fairseq_lightseq.__version__"}' in text
    assert not re.search(r'^version\s*=\s*"', text, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", fairseq_lightseq.__version__)


def test_the_benchmark_scripts_are_a_package_reached_without_path_inserts():
    """scripts/ is a package (`python -m scripts.NAME`); sys.path is changed only to select the tree a
    benchmark measures (bench_support/children.use_tree, --repo) and by the two checkpoint tools that also run as files."""
    assert os.path.isfile(os.path.join(REPO, "scripts", "__init__.py"))
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "scripts", "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, REPO)
        for n, line in enumerate(open(path), 1):
            if "sys.path.insert" in line:
                found.append(f"{rel}:{n}")
            if re.match(r"\s*(from|import) (bench_support|benchmark|bench_\w+|convert_checkpoint)\b", line):
                found.append(f"{rel}:{n}: {line.strip()}")
    allowed = {"scripts/convert_checkpoint.py", "scripts/average_checkpoints.py", "scripts/bench_support/children.py"}
    assert [f for f in found if f.split(":")[0] not in allowed] == []
    assert len([f for f in found if f.startswith("scripts/bench_support/children.py")]) == 1  # use_tree
