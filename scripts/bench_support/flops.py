"""Model FLOPs of a training step over non-pad tokens, and device peaks for MFU.

FLOPs of one training step (forward + backward = 3 x forward, 2 FLOPs per multiply-add):
    6 x (encoder-layer params x source tokens + (decoder-layer params + output projection) x target tokens)
  + 12 x d x sum over layers and sentences of (enc self: s^2, dec self: t^2, cross: s x t)
with s, t each sentence's non-pad source/target length (the attention term is QK^T and PV, counted on the
full t x t square in the decoder as the kernels compute it). A decoder-only model (the LM) has no encoder
layers and no source: 6 x (decoder-layer params + output projection) x tokens + 12 x d x layers x sum t^2.
An encoder-only model (RoBERTa) has no decoder layers; its "output projection" is the masked-LM head
(dense d x d + the tied d x V projection), applied to the masked rows only, and t is the masked count
(its target is pad elsewhere): 6 x (encoder-layer params x tokens + head params x masked tokens)
+ 12 x d x layers x sum s^2.
Embedding lookups are not matmuls and are not counted. Padding slots are not counted either: MFU measures useful work.
"""
import re

# Dense fp16/bf16 tensor-core peaks, TFLOP/s (NVIDIA data sheets, SXM parts).
PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0}


def device_peak_tflops(device_name: str, precision: str, override=None):
    """TFLOP/s for MFU: --peak-tflops if given, else the table for fp16/bf16 on a known GPU, else None."""
    if override:
        return override
    if precision not in ("fp16", "bf16"):
        return None
    for key, peak in PEAK_TFLOPS.items():
        if re.search(key, device_name or "", re.IGNORECASE):
            return peak
    return None


def model_shape(model) -> dict:
    """Parameter counts that one token touches, from a built fairseq (or ls) model of any family
    (a decoder-only model has no encoder: 0 encoder layers; an encoder-only one, RoBERTa, no decoder
    and its LM head as the output projection)."""
    encoder = getattr(model, "encoder", None)
    decoder = getattr(model, "decoder", None)
    head = getattr(encoder, "lm_head", None)
    if head is not None:  # RoBERTa: the sentence encoder inside, the head's dense layer + tied projection
        encoder = encoder.sentence_encoder
        emb = encoder.embed_tokens.weight
        out_proj = emb.numel() + head.dense.weight.numel()
    else:
        emb = decoder.embed_tokens.weight
        out_proj = emb.numel()
    enc = encoder.layers if encoder is not None else []
    dec = decoder.layers if decoder is not None else []
    return {"enc_layer_params": sum(p.numel() for p in enc.parameters()) if enc else 0,
            "dec_layer_params": sum(p.numel() for p in dec.parameters()) if dec else 0,
            "out_proj_params": out_proj, "embed_dim": emb.shape[1], "enc_layers": len(enc), "dec_layers": len(dec)}


def batch_flops(sample, shape: dict, pad: int = 1) -> float:
    """Model FLOPs of one training step on this batch (see the module docstring)."""
    t = (sample["target"] != pad).sum(1).double()
    s = sample["net_input"]["src_lengths"].double() if shape["enc_layers"] else t.new_zeros(t.shape)
    dense = 6.0 * (shape["enc_layer_params"] * float(s.sum())
                   + (shape["dec_layer_params"] + shape["out_proj_params"]) * float(t.sum()))
    attn = 12.0 * shape["embed_dim"] * (shape["enc_layers"] * float((s * s).sum())
                                        + shape["dec_layers"] * float((t * t + s * t).sum()))
    return dense + attn
