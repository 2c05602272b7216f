"""scripts/cuda_mutants.py's reading of a pytest run: the row it writes names the test that failed, whole."""
from scripts.cuda_mutants import first_failure


def test_a_failed_test_id_with_spaces_is_kept_whole_with_its_check():
    test = "tests/ops/test_embedding.py::test_bad_token[[[2, 10]]-token id 10 exceeds num_embeddings 10-cuda_emu]"
    out = (f"{test} FAILED [ 50%]\nE   RuntimeError: [emulated: initcheck] kernel k, block 0\n"
           f"FAILED {test} - RuntimeError: [emulated: initcheck] kernel k\n")
    assert first_failure(out, "", 1) == f"{test} (initcheck)"


def test_addresssanitizer_names_the_test_it_stopped_in():
    out = "tests/ops/test_a.py::t[1 2] PASSED [ 50%]\ntests/ops/test_a.py::t[3 4] "
    err = "==1==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x1"
    assert first_failure(out, err, -6) == "AddressSanitizer (heap-buffer-overflow) in tests/ops/test_a.py::t[3 4]"


def test_a_process_that_died_without_a_report():
    assert first_failure("tests/ops/test_a.py::t[1] ", "", -11) == "the test process died (signal 11)"
