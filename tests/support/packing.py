"""Packed rows of a padded time-major batch: the real tokens of a [T, B] batch in sentence-major order,
each named by the padded row t * B + b it comes from (the row map a token-wise op's dropout takes)."""
import torch


def padding_mask(T: int, B: int, layout: str, seed: int = 0) -> torch.Tensor:
    """[T, B] bool, True = pad, for sentences of random lengths in [1, T] (sentence 0 of length T, as in
    a real batch) padded on the "left" or "right"; "none": no padding."""
    pad = torch.zeros(T, B, dtype=torch.bool)
    if layout == "none":
        return pad
    lengths = torch.randint(1, T + 1, (B,), generator=torch.Generator().manual_seed(seed))
    lengths[0] = T
    for b in range(B):
        n = int(lengths[b])
        if layout == "left":
            pad[: T - n, b] = True
        else:
            pad[n:, b] = True
    return pad


def packed_rows(pad: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the padded row t * B + b of each real token of pad ([T, B] bool, True = pad), sentence
    b by sentence b, in time order within each."""
    B = pad.shape[1]
    b, t = (~pad).t().nonzero(as_tuple=True)
    return t * B + b
