"""Proof that the emulated CUDA device can fail: typical CUDA bugs put into the kernels one at a time, each run
against the emulated tests that cover it.

    python -m scripts.cuda_mutants [--only N ...] [--json FILE]
    python -m scripts.cuda_mutants --perf [--only N ...] [--json FILE]   (slow but correct kernels against the
                                                                         kernel profile's guard: its own module)

For every mutant: a copy of csrc/ with one edit of one kernel file, an emulated library rebuilt from that copy
(the files the edit reaches; the others are `make emulated`'s objects), and `pytest -m cuda_emulated -x` over
the mutant's tests with FLS_CUDA_EMULATION_LIBRARY pointing at it: first the checked build in thread order
(every access observed: racecheck, initcheck, shared bounds, global races, besides synccheck), where that
passes (or the process dies) the build under AddressSanitizer in thread order, then in a seeded random order. One row per mutant:
the file, the bug, and the test that caught it (with the check that failed it, where one did) or NOT CAUGHT. The exit status is 1 when a mutant was not caught (or its edit no longer
applies to the sources). Needs `make build emulated` done and CUDA's headers.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_INCLUDE = os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")


class Mutant(NamedTuple):
    file: str  # under csrc/cuda/
    bug: str
    old: str  # replaced once (its first occurrence)
    new: str
    tests: List[str]


LN = "tests/ops/test_layer_norm.py"
SOFTMAX = "tests/ops/test_attention.py"
XENT = "tests/ops/test_cross_entropy.py"
DROPOUT = "tests/ops/test_dropout.py"
VARLEN = "tests/ops/test_varlen_attention.py"
EMB = "tests/ops/test_embedding.py"
HEADS = "tests/ops/test_attention.py"

MUTANTS = [
    Mutant("reduce.cuh", "removed __syncthreads (block_sum reads the warps' partial sums unordered)",
           "  if (lane == 0) scratch[warp] = v;\n  __syncthreads();\n", "  if (lane == 0) scratch[warp] = v;\n",
           [LN, XENT]),
    Mutant("reduce.cuh", "race between warps on shared memory (block_sum's first barrier removed: a warp "
           "overwrites scratch while another still reads the previous sum)",
           "  __syncthreads();  // scratch may still be read by a previous call\n", "", [LN, SOFTMAX]),
    Mutant("reduce.cuh", "wrong shuffle offset (the butterfly starts at G/4)",
           "for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync", "for (int o = G / 4; o > 0; o >>= 1) v += "
           "__shfl_xor_sync", [LN, XENT]),
    Mutant("reduce.cuh", "wrong shuffle width (16 instead of the warp)",
           "v += __shfl_xor_sync(0xffffffffu, v, o);", "v += __shfl_xor_sync(0xffffffffu, v, o, 16);", [LN, XENT]),
    Mutant("reduce.cuh", "reduction over the wrong warp count (half the warps)",
           "nwarps = (blockDim.x + 31) >> 5;\n  __syncthreads();  // scratch", "nwarps = (blockDim.x + 31) >> 6;\n"
           "  __syncthreads();  // scratch", [LN, XENT]),
    Mutant("layer_norm.cu", "off-by-one in a tail loop (the row's last column left out of the mean)",
           "for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_float(xr[c]);",
           "for (int64_t c = threadIdx.x; c < cols - 1; c += blockDim.x) s += to_float(xr[c]);", [LN]),
    Mutant("layer_norm.cu", "grid too small for its work (one block short of a block per row)",
           "launch<ln_fwd_kernel<T>>(static_cast<unsigned>(rows),",
           "launch<ln_fwd_kernel<T>>(static_cast<unsigned>(rows > 1 ? rows - 1 : 1),", [LN]),
    Mutant("layer_norm.cu", "wrong vector-load stride (rows apart by cols / 8 instead of cols elements)",
           "const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);",
           "const uint4* xr = reinterpret_cast<const uint4*>(x + row * (cols / Pack<T>::kN));", [LN]),
    Mutant("layer_norm.cu", "a block over 1024 threads", "constexpr int kRowThreads = 256;",
           "constexpr int kRowThreads = 2048;", [LN]),
    Mutant("layer_norm.cu", "wrong dtype accumulation (the row sum rounded to the storage dtype at every add)",
           "for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_float(xr[c]);",
           "for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s = to_float(from_float<T>(s + "
           "to_float(xr[c])));", [LN]),
    Mutant("column_sums.cuh", "wrong shared-memory index (every column reads group sums of column 0)",
           "t0 += s0[q][tc];", "t0 += s0[q][0];", [LN]),
    Mutant("column_sums.cuh", "missing bounds check (the last tile writes columns past the row)",
           "if (g == 0 && c < cols) {", "if (g == 0) {", [LN]),
    Mutant("dropout.cu", "dropout offset off by one (element e takes the keep bit of e + 1)",
           "const int64_t e = static_cast<int64_t>((g0 + i) * 4 + k - d.offset);",
           "const int64_t e = static_cast<int64_t>((g0 + i) * 4 + k - d.offset + 1);", [DROPOUT]),
    Mutant("attention_softmax.cu", "removed the -inf guard of the online softmax sum",
           "    if (x == -INFINITY) continue;", "", ["tests/ops/test_cuda_defects.py", SOFTMAX]),
    Mutant("varlen_attention.cu", "wrong shuffle source lane in the attention-weight broadcast",
           "axpy_lane(acc, __shfl_sync(0xffffffffu, w, jj),", "axpy_lane(acc, __shfl_sync(0xffffffffu, w, jj + 1),",
           [VARLEN]),
    Mutant("embedding.cu", "missing bounds check (token ids not checked against num_embeddings)",
           "    check_id(tok, num_embeddings, false);\n    const int64_t pos = kPos ? positions[r] : 0;",
           "    const int64_t pos = kPos ? positions[r] : 0;", [EMB]),
    Mutant("reduce.cuh", "block max over every scratch slot (the slots of warps the block does not have are "
           "unwritten: NaN poison, which fmaxf drops)", "v = lane < nwarps ? scratch[lane] : -INFINITY;",
           "v = scratch[lane];", [XENT, SOFTMAX]),
    Mutant("cross_entropy.cu", "backward row bound off by one (v <= V: each row's thread writes the next row's "
           "first element)", "for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {\n    const float p",
           "for (int64_t v = threadIdx.x; v <= V; v += blockDim.x) {\n    const float p", [XENT]),
    Mutant("reduce.cuh", "divergent __syncthreads (the barrier after the warps' partial sums in both branches "
           "of an if)", "  if (lane == 0) scratch[warp] = v;\n  __syncthreads();\n  v = lane < nwarps ? scratch[lane] "
           ": 0.0f;", "  if (lane == 0) {\n    scratch[warp] = v;\n    __syncthreads();\n  } else {\n"
           "    __syncthreads();\n  }\n  v = lane < nwarps ? scratch[lane] : 0.0f;", [LN, XENT]),
    Mutant("varlen_attention.cu", "__syncwarp removed after a warp's row is stored to shared memory (the "
           "shuffles that follow exchange registers, not memory)",
           "  for (int d = lane; d < D; d += 32) dst[d] = to_float(x[d]);\n  __syncwarp();\n",
           "  for (int d = lane; d < D; d += 32) dst[d] = to_float(x[d]);\n", [VARLEN]),
    Mutant("dropout.cu", "a static shared array one element short (the last thread writes one past its end)",
           "FLS_SHARED(float, red, [kThreads * V]);", "FLS_SHARED(float, red, [kThreads * V - 1]);", [DROPOUT]),
    Mutant("attention_heads.cu", "an output row left unwritten (merge_heads' vector path stops one token row short)",
           "r < g.rows; r += gridDim.y * blockDim.y) {\n    const uint32_t t = r / g.B, b = r - t * g.B;\n    y[",
           "r + 1 < g.rows; r += gridDim.y * blockDim.y) {\n    const uint32_t t = r / g.B, b = r - t * g.B;\n    y[",
           [HEADS]),
]


# As the Makefile builds the variants: (.cu flags, link flags, the prebuilt .cu objects, the prebuilt .cpp objects).
FLAGS = ["-std=c++20", "-O2", "-fPIC", "-DFLS_CUDA_EMULATION", f"-I{CUDA_INCLUDE}", "-Icsrc/include",
         "-Icsrc/emulation"]
VARIANTS = {
    "checked": (["-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-g1"], [],
                os.path.join(ROOT, "build/emulation-checked"), os.path.join(ROOT, "build/emulation")),
    "asan": (["-fsanitize=address"], ["-fsanitize=address"], os.path.join(ROOT, "build/emulation-asan"),
             os.path.join(ROOT, "build/emulation-asan")),
}
CHECKS = r"\[emulated: (racecheck|initcheck|synccheck|bounds|global race)"


def mutated_tree(src: str, file: str, edits, count: int) -> bool:
    """A copy of csrc/ at src with each (old, new) of `edits` applied to csrc/cuda/`file` (the first `count`
    occurrences; -1: all); False, leaving the file as it was, when an edit does not apply."""
    for sub in ("csrc/cuda", "csrc/include", "csrc/kernels", "csrc/emulation"):
        shutil.copytree(os.path.join(ROOT, sub), os.path.join(src, sub))
    path = os.path.join(src, "csrc/cuda", file)
    text = open(path).read()
    if any(old not in text for old, _ in edits):
        return False
    for old, new in edits:
        text = text.replace(old, new, count)
    open(path, "w").write(text)
    return True


def reached(mutated: str) -> set:
    """The .cu files of csrc/cuda that include `mutated` (a file name there), directly or through headers."""
    names, grew = {mutated}, True
    while grew:
        grew = False
        for path in glob.glob(os.path.join(ROOT, "csrc/cuda/*.cu*")):
            name = os.path.basename(path)
            if name not in names and any(f'#include "{n}"' in open(path).read() for n in names):
                names.add(name)
                grew = True
    return {n for n in names if n.endswith(".cu")}


def build(src_root: str, out: str, mutated: str, jobs: int, variant: str) -> None:
    """The emulated library `variant` into out: the .cu files the edit of `mutated` reaches compiled from the
    csrc/ under src_root (objects beside out), every other object `make emulated`'s."""
    flags, link, prebuilt_cu, prebuilt_cpp = VARIANTS[variant]
    objs, cmds = [], []
    rebuild = reached(mutated)
    for cu in sorted(glob.glob(os.path.join(src_root, "csrc/cuda/*.cu"))):
        name = os.path.basename(cu)
        if name not in rebuild:
            objs.append(os.path.join(prebuilt_cu, "csrc/cuda", name + ".o"))
            continue
        obj = os.path.join(os.path.dirname(out), name + ".o")
        cmds.append(["g++", *FLAGS, *flags, "-x", "c++", "-include", "csrc/emulation/cuda_emulation.h", "-c", cu,
                     "-o", obj])
        objs.append(obj)
    objs += sorted(glob.glob(os.path.join(prebuilt_cpp, "csrc/emulation/*.cpp.o")))
    objs += sorted(glob.glob(os.path.join(prebuilt_cu, "tests/emulation/*.cu.o")))
    running = []
    for cmd in cmds:
        running.append(subprocess.Popen(cmd, cwd=src_root, stderr=subprocess.PIPE, text=True))
        if len(running) >= jobs:
            _wait(running.pop(0))
    for p in running:
        _wait(p)
    subprocess.run(["g++", "-shared", *link, "-o", out, *objs], check=True)


def _wait(p):
    _, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(p.args)}\n{err[-3000:]}")


def run_tests(lib: str, tests: List[str], schedule: str, asan: bool) -> tuple:
    """(caught, by): whether pytest failed on the tests with the emulated library `lib`, and the first failure."""
    env = dict(os.environ, FLS_CUDA_EMULATION="1", FLS_CUDA_EMULATION_LIBRARY=lib, FLS_EMULATION_SCHEDULE=schedule,
               FLS_EMULATION_SEED="1")
    if asan:
        env["LD_PRELOAD"] = " ".join(subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True,
                                                    text=True, check=True).stdout.strip()
                                     for name in ("libasan.so", "libstdc++.so"))
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    # -v: each test's id is printed before it runs; --capture=sys: AddressSanitizer's report (C's stderr) reaches
    # the output rather than pytest's capture file, which the aborting process never reads back.
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-x", "--capture=sys", "-p", "no:cacheprovider", "-m",
                        "cuda_emulated", *tests], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return (False, "") if r.returncode == 0 else (True, first_failure(r.stdout, r.stderr, r.returncode))


def first_failure(stdout: str, stderr: str, returncode: int) -> str:
    """What failed a pytest run (`pytest -v -x`): the first failed test (with the emulated check that failed it,
    where one did), else the test AddressSanitizer stopped in, else how the process ended."""
    # a test id may hold spaces (its parameters): pytest ends the summary line's id at " - " (the message)
    failed = re.findall(r"^FAILED (.+?)(?: - .*)?$", stdout, re.M)
    if failed:
        check = re.search(CHECKS, stdout)
        return f"{failed[0]} ({check.group(1)})" if check else failed[0]
    asan = re.search(r"ERROR: AddressSanitizer: ([\w-]+)", stderr)
    if asan:
        running = re.findall(r"^(tests/\S+::.+?)(?: (?:PASSED|FAILED|SKIPPED|ERROR)\b.*)?$", stdout, re.M)
        return f"AddressSanitizer ({asan.group(1)}) in {running[-1].strip() if running else 'a test'}"
    if returncode < 0:
        return f"the test process died (signal {-returncode})"
    last = (stdout + stderr).strip().splitlines()
    return last[-1][:200] if last else f"the test process ended with status {returncode}, printing nothing"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", type=int, nargs="*", help="mutant numbers (1-based) to run; default all")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compiles")
    ap.add_argument("--perf", action="store_true", help="the performance mutants (scripts/kernel_profile/mutants.py)")
    args = ap.parse_args(argv)
    if args.perf:
        from scripts.kernel_profile import mutants

        return mutants.main(args.only, args.json, args.jobs)
    if not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda_runtime.h")):
        print(f"cuda_mutants: CUDA's headers are not in {CUDA_INCLUDE} (set CUDA_INCLUDE)", file=sys.stderr)
        return 2
    if not all(os.path.exists(os.path.join(v[2], "csrc/cuda/adam.cu.o")) for v in VARIANTS.values()):
        print("cuda_mutants: run `make emulated` first (the unmutated objects)", file=sys.stderr)
        return 2
    chosen = [(i + 1, m) for i, m in enumerate(MUTANTS) if not args.only or i + 1 in args.only]

    def check(src, m):
        lib = os.path.join(src, "checked", "_cuda_emulated.so")
        os.makedirs(os.path.dirname(lib))
        build(src, lib, m.file, args.jobs, "checked")
        caught, by = run_tests(lib, m.tests, "ordered", asan=False)
        # A process that died (a heap the mutant corrupted) was caught by luck, not by a check: the
        # AddressSanitizer build says what happened.
        died = by if by.startswith("the test process") else ""
        if not caught or died:
            lib = os.path.join(src, "asan", "_cuda_emulated.so")
            os.makedirs(os.path.dirname(lib))
            build(src, lib, m.file, args.jobs, "asan")
            caught, by = run_tests(lib, m.tests, "ordered", asan=True)
            by = f"{by} (AddressSanitizer build)" if caught and "AddressSanitizer" not in by else by
            if not caught:
                caught, by = run_tests(lib, m.tests, "random", asan=True)
                by = f"{by} (AddressSanitizer build, random schedule)" if caught else by
            if not caught and died:
                caught, by = True, f"{died} (checked build)"
        return caught, by

    return run_mutants(chosen, "mutants", lambda m: ([(m.old, m.new)], 1), check, args.json)


def run_mutants(chosen, what: str, edits_of, check, json_path) -> int:
    """Each (n, mutant) of `chosen` (a `file` and a `bug` each) in a mutated copy of csrc/ (edits_of(m): the edits
    and how many occurrences of each to replace), checked by check(src, m) -> (caught, by); prints a row per
    mutant and writes them to json_path under `what`. 1 when one was not caught or its edit does not apply."""
    rows, missed = [], 0
    print(f"{'#':>2}  {'file':22} bug / caught by")
    with tempfile.TemporaryDirectory(prefix="fls-mutants-") as tmp:
        for n, m in chosen:
            t0 = time.time()
            src = os.path.join(tmp, f"m{n}")
            if not mutated_tree(src, m.file, *edits_of(m)):
                row = dict(n=n, file=m.file, bug=m.bug, caught_by="EDIT DOES NOT APPLY")
                missed += 1
            else:
                caught, by = check(src, m)
                row = dict(n=n, file=m.file, bug=m.bug, caught_by=by if caught else "NOT CAUGHT")
                missed += not caught
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            print(f"{n:>2}  {m.file:22} {m.bug}\n{'':26}{row['caught_by']}", flush=True)
            shutil.rmtree(src)
    print(f"{len(rows) - missed} of {len(rows)} {what} caught")
    if json_path:
        from scripts.bench_support.provenance import commit

        with open(json_path, "w") as f:
            json.dump({**commit(ROOT), what.replace(" ", "_"): rows}, f, indent=1)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
