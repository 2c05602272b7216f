"""The compiled library fairseq_lightseq._C (the package metadata is in pyproject.toml).

CPU kernels are always built (C++20, -O3, OpenMP). CUDA kernels are added when torch has CUDA and
nvcc is found (CUDA_HOME), for TORCH_CUDA_ARCH_LIST (default "8.0;9.0"). FLS_CUDA=1 forces CUDA on
(an error if it cannot be built), FLS_CUDA=0 forces it off.

Install with `pip install --no-build-isolation .` after torch and fairseq: the extension is compiled
against the installed torch, which an isolated build would not see.
"""
import glob
import os

from setuptools import setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as e:  # an isolated build (pip without --no-build-isolation) has no torch
    raise SystemExit(
        "fairseq_lightseq: building needs the torch it will run with: install torch first, then "
        f"`pip install --no-build-isolation .` ({e})") from None

HERE = os.path.dirname(os.path.abspath(__file__))


def want_cuda():
    flag = os.environ.get("FLS_CUDA", "").strip()
    possible = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if flag == "1":
        if not possible:
            raise RuntimeError(
                "FLS_CUDA=1 but CUDA cannot be built: torch.version.cuda=%s, CUDA_HOME=%s"
                % (torch.version.cuda, cpp_extension.CUDA_HOME))
        return True
    if flag == "0":
        return False
    return possible


def cpu_arch_flags():
    """-march for the CPU kernels: FLS_CPU_ARCH if set (e.g. "x86-64" for a portable build), else
    x86-64-v3 (AVX2+FMA, every x86 server CPU since 2013) when the build machine has AVX2, so the
    kernels' loops vectorise 8-wide. A binary built this way needs an AVX2 CPU."""
    arch = os.environ.get("FLS_CPU_ARCH")
    if arch is None:
        try:
            with open("/proc/cpuinfo") as f:
                arch = "x86-64-v3" if " avx2" in f.read() else ""
        except OSError:
            arch = ""
    # No FMA contraction: a*b+c rounds twice, as in the PyTorch reference ops, so the fp32 kernels
    # that promise bitwise equality with the reference (embedding, masks) keep it.
    return ["-march=" + arch, "-ffp-contract=off"] if arch else []


def sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


def extension():
    cuda = want_cuda()
    # C++20: the headers of torch 2.13 use C++20 features (warnings under C++17). -fno-math-errno (as torch
    # builds): math calls need not set errno, so loops with sqrtf vectorise (Adam); results are the same.
    cxx = ["-O3", "-std=c++20", "-fopenmp", "-fno-math-errno"] + cpu_arch_flags()
    defines = [("FLS_TORCH_VERSION", '"%s"' % torch.__version__)]
    # csrc/*.cpp: the module (registration) and the emulated device's poisoned allocator
    srcs = sources("csrc/*.cpp") + sources("csrc/ops/*.cpp") + sources("csrc/cpu/*.cpp")
    include_dirs = [os.path.join(HERE, "csrc/include")]
    if not cuda:
        return cpp_extension.CppExtension(
            "fairseq_lightseq._C", srcs, include_dirs=include_dirs, define_macros=defines,
            extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    defines += [("FLS_WITH_CUDA", None),
                ("FLS_CUDA_ARCHS", '"%s"' % os.environ["TORCH_CUDA_ARCH_LIST"])]
    nvcc = ["-O3", "-std=c++17", "-lineinfo"]
    return cpp_extension.CUDAExtension(
        "fairseq_lightseq._C", srcs + sources("csrc/cuda/*.cu"),
        include_dirs=include_dirs,
        define_macros=defines, extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=["-fopenmp"])


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
