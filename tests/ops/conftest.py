"""The op tests check the compiled kernels: without fairseq_lightseq._C they are skipped with one
reason, or fail where FLS_REQUIRE_KERNELS=1 (`make test`, hence CI, sets it: a broken build must not
pass as skips)."""
import os

import pytest

from fairseq_lightseq.ops import _backend


@pytest.fixture(autouse=True)
def _require_kernels():
    if _backend._C is None:
        reason = f"fairseq_lightseq._C is not built ({_backend.LOAD_ERROR}); run `make build`"
        if os.environ.get("FLS_REQUIRE_KERNELS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
