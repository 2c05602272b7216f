"""`python -m fairseq_lightseq.info` reports what was built, and its op table matches the registry."""
import subprocess
import sys

import pytest

from fairseq_lightseq import info
from fairseq_lightseq.ops import _backend


@pytest.mark.skipif(_backend._C is None, reason="compiled library not built")
def test_every_public_op_reports_its_compiled_cpu_kernel():
    table = info.backend_table()
    assert set(table) == set(info.OPS)
    assert {name: row["cpu"] for name, row in table.items()} == {name: "compiled" for name in info.OPS}
    expected_cuda = "compiled" if _backend.BUILD_INFO["with_cuda"] else "reference"
    assert {row["cuda"] for row in table.values()} == {expected_cuda}


def test_info_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "fairseq_lightseq.info"], capture_output=True, text=True,
                         check=True).stdout
    assert "compiled library" in out
    for name in info.OPS:
        assert name in out


def test_gpu_check_script_parses():
    """scripts/gpu_check.sh only runs on a lent GPU, minutes at a time: CI at least parses it."""
    import os
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "gpu_check.sh")
    subprocess.run(["bash", "-n", script], check=True)
