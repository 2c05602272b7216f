"""`python -m fairseq_lightseq.info`: what was built and which backend each op runs on.

The op table is derived, not kept by hand: its rows are the public ops (the functions the
fairseq_lightseq.ops package exports from its op group modules' __all__), and each row's backend comes
from the compiled ops registered in the fairseq_lightseq namespace whose stem (the op name without
_fwd/_bwd/_) is part of the public op's name: `attention_softmax_fwd` belongs to
`attention_softmax_dropout`, `label_smoothed_cross_entropy_fwd` to `label_smoothed_cross_entropy` and
`linear_label_smoothed_cross_entropy`.
"""
import inspect
import platform

import fairseq
import torch

from fairseq_lightseq import ops
from fairseq_lightseq.ops import flash_attention


def public_ops():
    """{name: function} of the public ops: the functions that the fairseq_lightseq.ops package exports from
    its op group modules' __all__ (not the dropout stream, the reference package or the sublayer blocks,
    which compose ops, nor a type such as AttentionCoords)."""
    return {name: obj for name, obj in ops.OP_GROUP_EXPORTS.items() if inspect.isfunction(obj)}


def registered_ops():
    """Names (without namespace) of every op the compiled library registered, but the sublayer blocks'
    (compositions of the others, ops.blocks.COMPILED_OPS); empty when it is not loaded."""
    return [op for op in ops.registered_ops() if op not in ops.blocks.COMPILED_OPS]


def stem(op: str) -> str:
    """The stem of a compiled op: its name without the _fwd / _bwd suffix or the trailing _ of an
    in-place op."""
    for suffix in ("_fwd", "_bwd", "_"):
        if op.endswith(suffix):
            return op[: -len(suffix)]
    return op


def ops_of(public: str, registered):
    """The compiled ops serving public op `public`: those whose stem is part of its name, or whose name
    extends it (plain `dropout` is served by `dropout_mask`)."""
    return [op for op in registered if stem(op) in public or op.startswith(public + "_")]


def primary_op(public: str, registered):
    """The compiled op whose registration decides the backend of `public` (its forward, or the op itself);
    None when the library has none for it."""
    candidates = ops_of(public, registered)
    for op in candidates:
        if not op.endswith("_bwd"):
            return op
    return candidates[0] if candidates else None


def op_table():
    """{public op: compiled op deciding its backend, or None}."""
    registered = registered_ops()
    return {name: primary_op(name, registered) for name in sorted(public_ops())}


OPS = op_table()


def compiled(op, device_type: str) -> bool:
    """Whether compiled op `op` runs on device type "cpu" or "cuda": a kernel registered for that device,
    or one registered for every device (CompositeExplicitAutograd: dropout_mask, which has no tensor
    argument to dispatch on), and for CUDA only in a CUDA build."""
    if op is None or ops.LIBRARY_FILE is None:
        return False
    if device_type == "cuda" and not ops.BUILD_INFO["with_cuda"]:
        return False
    return ops.has_kernel(op, device_type) or torch._C._dispatch_has_kernel_for_dispatch_key(
        f"{ops.NAMESPACE}::{op}", "CompositeExplicitAutograd")


def backend_table():
    """{public op: {"cpu": backend, "cuda": backend}}, backend one of compiled / reference."""
    return {
        name: {dev: ("compiled" if compiled(op, dev) else "reference") for dev in ("cpu", "cuda")}
        for name, op in OPS.items()
    }


def main():
    info = ops.BUILD_INFO
    print(f"python            {platform.python_version()}")
    print(f"torch             {torch.__version__} (CUDA {torch.version.cuda}, device available: "
          f"{torch.cuda.is_available()})")
    print(f"fairseq           {fairseq.__version__}")
    if ops.LIBRARY_FILE is None:
        print(f"compiled library  NOT LOADED: {ops.LOAD_ERROR}")
    else:
        print(f"compiled library  {ops.LIBRARY_FILE}")
        print(f"  built against   torch {info['torch_version']}, compiler {info['compiler']}")
        print(f"  CUDA kernels    {'yes, archs ' + info['cuda_archs'] if info['with_cuda'] else 'no'}")
    problem = flash_attention.SCHEMA_PROBLEM
    print(f"flash varlen      torch's ops {'take our call' if problem is None else 'refused: ' + problem} "
          "(packed attention on CUDA, fp16/bf16, sm_80+, head dim <= 256)")
    print(f"\n{'op':36s} {'cpu':10s} cuda")
    for name, row in backend_table().items():
        print(f"{name:36s} {row['cpu']:10s} {row['cuda']}")


if __name__ == "__main__":
    main()
