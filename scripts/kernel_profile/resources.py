"""Registers, spills, stack and static shared memory of every kernel instance, as ptxas reports them
(`nvcc -Xptxas -v`) for each architecture the kernels are built for.

Compiling csrc/cuda/ for two architectures takes minutes on a small machine, so each file's report is kept in
build/kernel_profile/ptxas/ under a key of its text, the headers', the compiler's and the flags: an unchanged
file is read back (another source tree, e.g. a mutant's, compiles only the files it changed). Without nvcc,
resources() raises; the callers say so.

    python -m scripts.kernel_profile.resources     (`make cuda-check`: every file compiled for sm_90 and sm_80,
                                                    as the GPU build would; fails on any error or spill)
"""
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(ROOT, "build/kernel_profile/ptxas")
ARCHS = ("sm_90", "sm_80")
FLAGS = ["-std=c++17", "-O3", "-Icsrc/include"]  # as `make cuda-check` compiles them


class Resources(NamedTuple):
    regs: int  # per thread
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame per thread
    smem: int  # bytes of static shared memory per block


def nvcc() -> str:
    path = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(path):
        raise FileNotFoundError("nvcc not found (set NVCC=...): the kernels' registers come from ptxas")
    return path


def short_name(name: str) -> str:
    """A kernel instance without namespaces, return type and parameters, the same for ptxas's demangled name
    ('void fls::cuda::(anonymous namespace)::k<__half, 4>(const __half *, ...)') and the emulated device's
    ('fls::cuda::{anonymous}::k<__half, 4>'): 'k<__half, 4>'."""
    name = name.removeprefix("void ")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and not name.startswith(("(anonymous", "{anonymous"), i):
            cut = i
            break
    name = name[:cut]
    head, sep, args = name.partition("<")
    # an enumerator as gcc names it ('fls::Act::kRelu') as c++filt does ('(fls::Act)1')
    args = re.sub(r"\bfls::(\w+)::(\w+)", lambda m: f"(fls::{m.group(1)}){_enums()[m.group(1)][m.group(2)]}", args)
    return head.rsplit("::", 1)[-1] + sep + args


@functools.lru_cache(None)
def _enums() -> Dict[str, Dict[str, int]]:
    """{enum: {enumerator: value}} of the enums the kernels take as template arguments (csrc/include/fls/)."""
    out = {}
    for path in glob.glob(os.path.join(ROOT, "csrc/include/fls/*.h")):
        for name, body in re.findall(r"enum class (\w+)[^{]*\{([^}]*)\}", open(path).read()):
            out[name] = {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", body)}
    return out


def parse_ptxas(text: str) -> Dict[str, Resources]:
    """{mangled entry name: Resources} from the output of `ptxas -v`."""
    out, current, frame = {}, None, (0, 0, 0)
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for", line)
        if m:
            current, frame = m.group(1), (0, 0, 0)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            frame = tuple(int(g) for g in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            smem = re.search(r"(\d+) bytes smem", line)
            out[current] = Resources(int(m.group(1)), frame[1], frame[2], frame[0], int(smem.group(1)) if smem else 0)
            current = None
    return out


def demangle(names):
    res = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return res.stdout.splitlines()


def _compile(src: str, arch: str, root: str) -> str:
    print(f"nvcc {arch} {os.path.relpath(src, root)}", file=sys.stderr, flush=True)
    res = subprocess.run([nvcc(), *FLAGS, "-gencode", f"arch=compute_{arch[3:]},code={arch}", "-Xptxas", "-v", "-c",
                          src, "-o", os.devnull], cwd=root, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc {arch} {src} failed:\n{res.stderr[-2000:]}")
    return res.stderr + res.stdout


def _key(src: str, arch: str, root: str) -> str:
    h = hashlib.sha256(" ".join(FLAGS + [arch]).encode())
    h.update(subprocess.run([nvcc(), "--version"], capture_output=True, text=True).stdout.encode())
    for path in [src] + sorted(glob.glob(os.path.join(root, "csrc/cuda/*.cuh")) +
                               glob.glob(os.path.join(root, "csrc/include/**/*.h"), recursive=True) +
                               glob.glob(os.path.join(root, "csrc/kernels/*.h"))):
        h.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _file_resources(src: str, arch: str, root: str) -> Dict[str, list]:
    """{short name: Resources fields} of one file for one arch, from the cache or ptxas."""
    path = os.path.join(CACHE, _key(src, arch, root) + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    parsed = parse_ptxas(_compile(src, arch, root))
    out = {}
    for name, r in zip(demangle(list(parsed)), parsed.values()):
        old = out.get(short_name(name))
        out[short_name(name)] = list(r) if old is None or r.regs > old[0] else old
    os.makedirs(CACHE, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def resources(root: str = ROOT, jobs: int = 2) -> Dict[str, Dict[str, Resources]]:
    """{arch: {kernel instance (short_name): Resources}} for every kernel of `root`/csrc/cuda/*.cu; an instance
    compiled in two files (none today) keeps the larger register count."""
    work = [(src, arch) for arch in ARCHS for src in sorted(glob.glob(os.path.join(root, "csrc/cuda/*.cu")))]
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda w: _file_resources(*w, root), work))
    out = {arch: {} for arch in ARCHS}
    for (_, arch), table in zip(work, results):
        for name, fields in table.items():
            old = out[arch].get(name)
            if old is None or fields[0] > old.regs:
                out[arch][name] = Resources(*fields)
    return out

def spills(table: Dict[str, Dict[str, Resources]]):
    """['arch kernel: N bytes spilled ...'] for every instance that spills registers to local memory."""
    return [f"{arch} {name}: {r.spill_stores} bytes of spill stores, {r.spill_loads} of spill loads "
            f"({r.regs} registers)" for arch, kernels in table.items() for name, r in sorted(kernels.items())
            if r.spill_stores or r.spill_loads]


def main() -> int:
    table = resources()
    found = spills(table)
    print(f"{sum(len(k) for k in table.values())} kernel instances compiled for {', '.join(table)}; "
          + (f"{len(found)} spill registers:" + "".join(f"\n  {s}" for s in found) if found else "none spills"))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
