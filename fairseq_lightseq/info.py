"""`python -m fairseq_lightseq.info`: what was built and which backend each op runs on."""
import platform

import torch

from fairseq_lightseq.ops import _backend

# Each public op and the compiled op whose registration decides its backend.
OPS = {
    "layer_norm": "layer_norm_fwd",
    "bias_dropout_residual": "bias_dropout_residual_fwd",
    "bias_act_dropout": "bias_act_dropout_fwd",
    "attention_softmax_dropout": "attention_softmax_fwd",
    "qkv_bias_split": "qkv_bias_split",
    "merge_heads": "merge_heads",
    "embedding": "embedding_fwd",
    "label_smoothed_cross_entropy": "label_smoothed_cross_entropy_fwd",
    "adam_step": "adam_step_",
}


def backend_table():
    """{public op: {"cpu": backend, "cuda": backend}}, backend one of compiled / reference."""
    return {
        name: {dev: ("compiled" if _backend.has_kernel(op, dev) else "reference") for dev in ("cpu", "cuda")}
        for name, op in OPS.items()
    }


def main():
    info = _backend.BUILD_INFO
    try:
        import fairseq
        fairseq_version = fairseq.__version__
    except Exception as e:  # fairseq is needed by the model/criterion/optimizer, not by the ops
        fairseq_version = f"not importable ({e})"
    print(f"python            {platform.python_version()}")
    print(f"torch             {torch.__version__} (CUDA {torch.version.cuda}, device available: "
          f"{torch.cuda.is_available()})")
    print(f"fairseq           {fairseq_version}")
    if _backend._C is None:
        print(f"compiled library  NOT LOADED: {_backend.LOAD_ERROR}")
    else:
        print(f"compiled library  {_backend._C.__file__}")
        print(f"  built against   torch {info['torch_version']}, compiler {info['compiler']}")
        print(f"  CUDA kernels    {'yes, archs ' + info['cuda_archs'] if info['with_cuda'] else 'no'}")
    print(f"\n{'op':30s} {'cpu':10s} cuda")
    for name, row in backend_table().items():
        print(f"{name:30s} {row['cpu']:10s} {row['cuda']}")


if __name__ == "__main__":
    main()
