"""Which lines of the CUDA kernels no emulated test reaches.

    python -m scripts.cuda_coverage [--tests PATH ...] [--json FILE]

Builds the emulated library (csrc/emulation/) with gcc's --coverage into build/emulation-coverage, runs the
tests marked cuda_emulated on it (thread order), and prints, per csrc/cuda file, the executable lines that
never ran, grouped by the function (kernel or launcher) that holds them. Needs `make build` and CUDA's headers.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_INCLUDE = os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")
OUT = os.path.join(ROOT, "build/emulation-coverage")
FLAGS = ["-std=c++20", "-O0", "-fPIC", "--coverage", "-DFLS_CUDA_EMULATION", f"-I{CUDA_INCLUDE}", "-Icsrc/include",
         "-Icsrc/emulation"]


def build() -> str:
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    objs = []
    for src in sorted(glob.glob(os.path.join(ROOT, "csrc/cuda/*.cu"))) + [
            os.path.join(ROOT, "csrc/emulation/scheduler.cpp"),
            *sorted(glob.glob(os.path.join(ROOT, "tests/emulation/*.cu")))]:
        obj = os.path.join(OUT, os.path.basename(src) + ".o")
        lang = ["-x", "c++", "-include", "csrc/emulation/cuda_emulation.h"] if src.endswith(".cu") else []
        subprocess.run(["g++", *FLAGS, *lang, "-c", src, "-o", obj], cwd=ROOT, check=True)
        objs.append(obj)
    lib = os.path.join(OUT, "_cuda_emulated.so")
    subprocess.run(["g++", "-shared", "--coverage", "-o", lib, *objs], check=True)
    return lib


def functions(path: str):
    """[(first line, name)] of the functions defined in a CUDA source, by a plain scan of its text: a line at
    column 0 that opens a parameter list (or, after a `__global__ ... __launch_bounds__(...)` line, the
    indented kernel name under it)."""
    out, after_global = [], False
    for i, line in enumerate(open(path), 1):
        top = not line.startswith((" ", "\t", "/", "#", "}", "{"))
        m = re.match(r"^.*\b(\w+)\(", line.split("//")[0]) if (top or after_global) else None
        if m and m.group(1) not in ("__launch_bounds__", "if", "for", "while", "switch", "return"):
            out.append((i, m.group(1)))
            after_global = False
        else:
            after_global = top and "__global__" in line
    return out


def counts(gcov_file: str):
    """(source path, {line: ran}) of one gcov report: ran is False for an executable line never run."""
    source, lines = None, {}
    for row in open(gcov_file):
        count, num, text = (row.split(":", 2) + ["", ""])[:3]
        count = count.strip()
        if num.strip() == "0" and text.startswith("Source:"):
            source = text[len("Source:"):].strip()
        elif count not in ("-", "") and num.strip().isdigit():  # a template's lines repeat per instance
            lines[int(num)] = lines.get(int(num), False) or count not in ("#####", "=====")
    return source, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", nargs="*", default=["tests"])
    ap.add_argument("--json", help="write {file: {function: [lines]}} here")
    args = ap.parse_args(argv)
    lib = build()
    env = dict(os.environ, FLS_CUDA_EMULATION="1", FLS_CUDA_EMULATION_LIBRARY=lib, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda_emulated",
                    *args.tests], cwd=ROOT, env=env)
    ran = {}  # {csrc/cuda file name: {line: ran in any object}}: a header counts in every file including it
    for src in sorted(glob.glob(os.path.join(ROOT, "csrc/cuda/*.cu"))):
        obj = os.path.join(OUT, os.path.basename(src) + ".o")
        subprocess.run(["gcov", "-l", "-p", "-o", OUT, obj], cwd=OUT, capture_output=True, check=True)
    for gcov_file in glob.glob(os.path.join(OUT, "*.gcov")):
        source, lines = counts(gcov_file)
        if source is None or "csrc/cuda/" not in source:
            continue
        merged = ran.setdefault(os.path.basename(source), {})
        for num, hit in lines.items():
            merged[num] = merged.get(num, False) or hit
    report = {}
    for name, lines in sorted(ran.items()):
        funcs = functions(os.path.join(ROOT, "csrc/cuda", name))
        for num in sorted(n for n, hit in lines.items() if not hit):
            owner = [f for start, f in funcs if start <= num]
            report.setdefault(name, {}).setdefault(owner[-1] if owner else "?", []).append(num)
    for path, by_function in report.items():
        print(f"== csrc/cuda/{path}")
        for function, lines in by_function.items():
            print(f"  {function}: lines " + ", ".join(map(str, lines)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
