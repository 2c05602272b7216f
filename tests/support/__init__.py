"""Helpers shared by the tests (imported as `support.<module>`; tests/conftest.py puts tests/ on the path).

* `support.tensors`: devices, dtypes, tolerances and random inputs for kernel-vs-reference checks;
* `support.models`: tiny fairseq `transformer` / `ls_transformer` pairs with the same weights, batches;
* `support.recipe`: running the WMT14 recipe scripts on a small prepared corpus (e2e tests).
* `support.dist`: running a function in W gloo processes (torch.distributed tests).
* `support.cli`: fairseq's command line on toy data-bins (e2e tests); `support.inprocess` runs its
  commands inside the test process (`train_losses`: every update's loss), `support.rank_server`
  forks the ranks of multi-process runs, `support.probe_train` records what the Trainer trains.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
