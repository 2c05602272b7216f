# The two commands (see README.md):
#   make test   sets up .venv from scratch if needed, builds the extension, checks every CUDA file
#               compiles (sm_80, sm_90) and runs the test suite.
#   make demo   sets up and runs the main job (train, decode, score BLEU).
#   make test-cuda-emulated [TESTS=...]   runs the CUDA tests on the emulated device (csrc/emulation/); part
#               of make test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PYTEST_ARGS ?=

DATA ?=
DEMO_ARGS ?=

.PHONY: test demo setup build cuda-check bench clean emulated test-cuda-emulated

test: setup cuda-check
	FLS_REQUIRE_KERNELS=1 $(PY) -m pytest $(PYTEST_ARGS) tests
	$(MAKE) --no-print-directory test-cuda-emulated

# Pinned stack. torch first and exactly pinned (an unpinned one pulls a multi-GB CUDA build); fairseq
# after it without build isolation for the same reason. fairscale (pure Python; needs only torch and numpy)
# for fairseq's --zero-sharding os and --ddp-backend fully_sharded. ctranslate2 (for the CTranslate2 export test;
# needs only numpy and pyyaml, so it leaves torch and numpy as they are) is optional: a platform without
# its wheel still sets up.
$(VENV)/.deps-installed:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q numpy cython setuptools wheel pybind11 ninja pytest sacrebleu sentencepiece
	$(PIP) install -q --no-build-isolation fairseq-fixed==0.12.3.1
	$(PIP) install -q fairscale==0.4.13
	$(PIP) install -q ctranslate2 || echo "NOTE: ctranslate2 not installed; tests/e2e/test_ctranslate2.py will be skipped"
	touch $@

setup: $(VENV)/.deps-installed build

# In-place build (incremental through ninja); the tests import the package from the source tree. The
# sources are byte-compiled too: where PYTHONDONTWRITEBYTECODE is set, every fairseq process the tests
# start would otherwise compile the package again (about a second each).
build: $(VENV)/.deps-installed
	$(PY) setup.py -q build_ext --inplace
	$(PY) -m compileall -q fairseq_lightseq scripts tests examples > /dev/null

# Compiles every CUDA file alone with nvcc -c for sm_80 and sm_90, as the GPU build would; fails on any error
# or a kernel that spills registers. Keeps ptxas's registers and shared memory per kernel for the kernel
# profile (scripts/kernel_profile/resources.py; standard library only).
cuda-check:
	@if [ -z "$(NVCC)" ]; then echo "SKIP cuda-check: nvcc not found (set NVCC=...)"; exit 0; fi; \
	NVCC=$(NVCC) $(PYTHON) -m scripts.kernel_profile.resources

# The main job; `make demo DATA=DIR` trains on a directory of raw parallel text (e.g. Multi30k).
demo: setup
	$(PY) -m fairseq_lightseq.demo $(if $(DATA),--data $(DATA)) $(DEMO_ARGS)

bench: setup
	$(PY) -m scripts.bench_ops

# The emulated CUDA device: csrc/cuda/*.cu compiled by the host compiler with the emulation header, as one
# shared library that fairseq_lightseq/ops/_backend.py loads before _C when FLS_CUDA_EMULATION=1; a second
# build of it under AddressSanitizer (every load and store of the kernels checked against torch's buffers); a
# third, the checked build, whose kernels are compiled with gcc's ThreadSanitizer instrumentation and linked
# without its runtime: csrc/emulation/observe.cpp sees every access, and checks.cpp runs compute-sanitizer's
# racecheck, initcheck and bounds checks on them (the emulator's own objects are the plain build's).
CUDA_INCLUDE ?= /usr/local/cuda/include
# (tests/emulation/*.cu: kernels for the emulator's own tests: ones that misuse CUDA on purpose, one per check)
EMU_SRCS := $(wildcard csrc/cuda/*.cu) $(wildcard csrc/emulation/*.cpp) $(wildcard tests/emulation/*.cu)
EMU_HDRS := $(wildcard csrc/cuda/*.cuh csrc/include/fls/*.h csrc/kernels/*.h csrc/emulation/*.h)
EMU_CXX ?= g++
EMU_FLAGS := -std=c++20 -O2 -fPIC -DFLS_CUDA_EMULATION -I$(CUDA_INCLUDE) -Icsrc/include -Icsrc/emulation
EMU_LIB := fairseq_lightseq/_cuda_emulated.so
EMU_ASAN_LIB := fairseq_lightseq/_cuda_emulated_asan.so
EMU_CHECKED_LIB := fairseq_lightseq/_cuda_emulated_checked.so
EMU_OBSERVE_FLAGS := -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -g1
# Preloaded into python for the AddressSanitizer run; libstdc++ too, or ASan cannot find the __cxa_throw
# it intercepts (torch's errors are C++ exceptions).
ASAN_RUNTIME = $(shell $(EMU_CXX) -print-file-name=libasan.so) $(shell $(EMU_CXX) -print-file-name=libstdc++.so)

build/emulation/%.cu.o: %.cu $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -x c++ -include csrc/emulation/cuda_emulation.h -c $< -o $@
build/emulation/%.cpp.o: %.cpp $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -c $< -o $@
build/emulation-asan/%.cu.o: %.cu $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -fsanitize=address -x c++ -include csrc/emulation/cuda_emulation.h -c $< -o $@
build/emulation-checked/%.cu.o: %.cu $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_OBSERVE_FLAGS) -x c++ -include csrc/emulation/cuda_emulation.h -c $< -o $@
build/emulation-asan/%.cpp.o: %.cpp $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -fsanitize=address -c $< -o $@

$(EMU_LIB): $(patsubst %,build/emulation/%.o,$(EMU_SRCS))
	$(EMU_CXX) -shared -o $@ $^
$(EMU_ASAN_LIB): $(patsubst %,build/emulation-asan/%.o,$(EMU_SRCS))
	$(EMU_CXX) -shared -fsanitize=address -o $@ $^

# No -fsanitize=thread here: the instrumentation's calls are observe.cpp's, not libtsan's.
$(EMU_CHECKED_LIB): $(patsubst %,build/emulation-checked/%.o,$(filter %.cu,$(EMU_SRCS))) \
                    $(patsubst %,build/emulation/%.o,$(filter %.cpp,$(EMU_SRCS)))
	$(EMU_CXX) -shared -o $@ $^

emulated: $(EMU_LIB) $(EMU_ASAN_LIB) $(EMU_CHECKED_LIB)

# The kernel profile's guard (tests/ops/test_kernel_profile_guard.py) runs once more, alone, on the checked build
# whose accesses are observed (docs/architecture.md, "The kernel profile"), when TESTS includes it.
# Every test marked cuda_emulated, three times: threads in index order on the checked build (every access
# observed: racecheck, initcheck, shared bounds, global races) with NaN poison, then on the plain build in a
# random order (seed 1) with the finite poison (FLS_EMULATION_POISON=finite), and under AddressSanitizer beside
# them (the two cores run both) in a random order of a second seed (2) with NaN poison. The second seed rides
# on the ASan pass, the longest, rather than on a fourth pass that would lengthen the other side past it: the
# out-of-bounds accesses ASan checks do not depend on the order, and the first pass covers index order.
# The end-to-end training runs, which reach no kernel path the op tests do not, are left out under ASan;
# --capture=sys lets an ASan report, written by C code to an aborting process's stderr, reach the log. TESTS
# picks a subset. Skipped, saying so,
# without CUDA's headers (CUDA_INCLUDE). One torch thread: the emulator runs on one, and idle OpenMP workers
# spinning beside it slowed the suite tenfold.
TESTS ?= tests
EMU_PYTEST = OMP_NUM_THREADS=1 FLS_CUDA_EMULATION=1 $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
EMU_ASAN_LOG := build/emulation-asan/pytest.log
test-cuda-emulated: build
	@if [ ! -f $(CUDA_INCLUDE)/cuda_runtime.h ]; then \
	  echo "SKIP test-cuda-emulated: no CUDA headers in $(CUDA_INCLUDE) (set CUDA_INCLUDE=...)"; exit 0; fi; \
	set -e; $(MAKE) --no-print-directory -j2 emulated; fail=; \
	echo "== emulated CUDA device under AddressSanitizer, random order (seed 2): in the background, $(EMU_ASAN_LOG)"; \
	( LD_PRELOAD="$(ASAN_RUNTIME)" ASAN_OPTIONS=detect_leaks=0 FLS_EMULATION_SCHEDULE=random FLS_EMULATION_SEED=2 \
	  FLS_CUDA_EMULATION_LIBRARY=$(CURDIR)/$(EMU_ASAN_LIB) $(EMU_PYTEST) -m "cuda_emulated and not e2e" \
	  --capture=sys $(TESTS) > $(EMU_ASAN_LOG) 2>&1 ) & asan=$$!; \
	echo "== emulated CUDA device: threads in index order, checked build, NaN poison"; \
	FLS_CUDA_EMULATION_LIBRARY=$(CURDIR)/$(EMU_CHECKED_LIB) $(EMU_PYTEST) -m cuda_emulated $(TESTS) || fail=1; \
	echo "== emulated CUDA device: random order (seed 1), finite poison"; \
	FLS_EMULATION_SCHEDULE=random FLS_EMULATION_SEED=1 FLS_EMULATION_POISON=finite \
	  $(EMU_PYTEST) -m cuda_emulated $(TESTS) || fail=1; \
	case " $(TESTS) " in *" tests "*|*kernel_profile_guard*) \
	  echo "== kernel profile guard: the checked build (csrc/cuda/profile_floors.json)"; \
	  FLS_KERNEL_PROFILE_GUARD=1 FLS_EMULATION_CHECKS=0 FLS_CUDA_EMULATION_LIBRARY=$(CURDIR)/$(EMU_CHECKED_LIB) \
	    $(EMU_PYTEST) -m cuda_emulated tests/ops/test_kernel_profile_guard.py || fail=1 ;; esac; \
	wait $$asan || fail=1; \
	echo "== emulated CUDA device under AddressSanitizer:"; tail -n 40 $(EMU_ASAN_LOG); \
	[ -z "$$fail" ]

clean:
	rm -rf build fairseq_lightseq/*.so
