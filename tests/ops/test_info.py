"""`python -m fairseq_lightseq.info` reports what was built; its op table is derived from the public ops
and the registry, and every public op and every registered op has its place in it."""
import inspect
import os
import subprocess
import sys

import pytest

import fairseq_lightseq.ops as ops
from fairseq_lightseq import info
needs_library = pytest.mark.skipif(ops.LIBRARY_FILE is None, reason="compiled library not built")

# What the table must find: every op exported by fairseq_lightseq.ops (the package's public surface).
EXPORTED = {name for name, obj in vars(ops).items()
            if inspect.isfunction(obj) and obj.__module__.startswith("fairseq_lightseq.ops.")
            and not obj.__module__.startswith(("fairseq_lightseq.ops.reference", "fairseq_lightseq.ops._backend",
                                               "fairseq_lightseq.ops.dropout_stream"))}


def test_every_exported_op_has_a_row():
    assert EXPORTED, "no public op found in fairseq_lightseq.ops"
    assert EXPORTED <= set(info.OPS), f"public ops without a row: {sorted(EXPORTED - set(info.OPS))}"


@needs_library
def test_every_public_op_has_a_compiled_op():
    assert {name: op for name, op in info.OPS.items() if op is None} == {}


@needs_library
def test_every_registered_op_belongs_to_a_public_op():
    registered = info.registered_ops()
    assert "layer_norm_fwd" in registered and "adam_step_" in registered
    orphans = [op for op in registered if not any(op in info.ops_of(name, registered) for name in info.OPS)]
    assert orphans == []


def test_stems():
    assert [info.stem(op) for op in ("layer_norm_fwd", "embedding_bwd", "adam_step_", "merge_heads")] == [
        "layer_norm", "embedding", "adam_step", "merge_heads"]


@needs_library
def test_every_public_op_reports_its_compiled_kernels():
    table = info.backend_table()
    assert set(table) == set(info.OPS)
    assert {name: row["cpu"] for name, row in table.items()} == {name: "compiled" for name in info.OPS}
    expected_cuda = "compiled" if ops.BUILD_INFO["with_cuda"] else "reference"
    assert {row["cuda"] for row in table.values()} == {expected_cuda}


def test_info_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "fairseq_lightseq.info"], capture_output=True, text=True,
                         check=True).stdout
    assert "compiled library" in out
    for name in info.OPS:
        assert name in out


def test_gpu_check_script_parses():
    """scripts/gpu_check.sh only runs on a lent GPU, minutes at a time: CI at least parses it."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                          "gpu_check.sh")
    subprocess.run(["bash", "-n", script], check=True)
