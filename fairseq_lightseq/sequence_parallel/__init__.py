"""Sequence parallelism: one batch's time axis split over the P ranks of a group.

* `groups`: the sequence-parallel process groups (contiguous rank blocks of the world);
* `collectives`: differentiable all-to-all, all-gather and reduce-scatter over such a group, with a
  count of the bytes each rank sends.
"""
