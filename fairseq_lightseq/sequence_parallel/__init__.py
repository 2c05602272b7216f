"""Sequence parallelism: one batch's time axis split over the P ranks of a group.

* `groups`: the sequence-parallel process groups (contiguous rank blocks of the world);
* `collectives`: differentiable all-to-all, all-gather and reduce-scatter over such a group, with a
  count of the bytes each rank sends;
* `sharding`: which rows of a time axis a rank holds (Shard), the dropout offsets that follow, and the
  shard a model's forward records for the criterion (recorded_shard);
* `options`: the --sequence-parallel-* options, their checks against the rest of the command line, and
  the setup a model's build_model calls.

The attention over sharded rows is a module of the layers (modules/sharded_attention.py): this package
sits below modules/ and imports none of it.
"""
