"""The sequence-parallel check every model family runs in its gloo ranks (support.dist.run): the
unsharded reference computed by each rank itself (one process, every data-parallel batch summed), then
this rank's sharded share through the criterion; the world all-reduce of the shares (what fairseq's
DDP does) must give the reference's summed logging values, sample size and every gradient."""
import torch
import torch.distributed as dist


def step(model, criterion, sample, seed, train, log_keys):
    """([the logging values of log_keys..., sample_size] float64, {name: grad}) of one forward/backward
    with torch's generator at `seed` (the dropout seed)."""
    model.zero_grad()
    model.train(train)
    torch.manual_seed(seed)
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}
    return torch.tensor([float(log[k]) for k in log_keys] + [float(sample_size)], dtype=torch.float64), grads


def assert_sharded_equals_one_process(model, attach, criterion, make_sample, P, mode, where, log_keys,
                                      train=True, seed=123, no_grad_ok=("version", "padding")):
    """attach(model, sequence_parallel or None) shards the model; make_sample(dp_index) gives the batch
    of a data-parallel group. Relative tolerance 1e-9 (float64). Returns the largest relative error of a
    gradient (max |SP - one| / max |one| over a tensor, for the tensors whose gradient is not zero)."""
    from fairseq_lightseq.sequence_parallel.groups import new_sequence_parallel_group
    from fairseq_lightseq.sequence_parallel.sharding import SequenceParallel

    world = dist.get_world_size()
    model.ls_packed = False  # sequence parallelism shards padded rows (a model built with it packs nothing)
    g = new_sequence_parallel_group(P)
    ref_counts, ref_grads = 0, None
    for d in range(world // P):
        c, gr = step(model, criterion, make_sample(d), seed, train, log_keys)
        ref_counts = ref_counts + c
        ref_grads = gr if ref_grads is None else {n: ref_grads[n] + gr[n] for n in gr}
    attach(model, SequenceParallel(g.group, P, g.rank, mode))
    try:
        counts, grads = step(model, criterion, make_sample(g.index), seed, train, log_keys)
    finally:
        attach(model, None)
    # one all-reduce for the counts and every gradient (a collective per tensor costs a round trip each)
    flat = torch.cat([counts] + [gr.reshape(-1) for gr in grads.values()])
    dist.all_reduce(flat)
    counts, rest = flat[:counts.numel()], flat[counts.numel():]
    for gr in grads.values():
        gr.copy_(rest[:gr.numel()].view_as(gr))
        rest = rest[gr.numel():]
    torch.testing.assert_close(counts, ref_counts, rtol=1e-9, atol=1e-9, msg=lambda m: f"{where}: counts {m}")
    worst = 0.0
    for n, gr in grads.items():
        torch.testing.assert_close(gr, ref_grads[n], rtol=1e-9, atol=1e-11, msg=lambda m: f"{where}: grad {n} {m}")
        assert ref_grads[n].abs().sum() > 0 or any(k in n for k in no_grad_ok), f"{where}: {n} has no gradient"
        scale = ref_grads[n].abs().max().item()
        if scale > 1e-8:  # not the key biases' (zero in exact arithmetic: rounding noise)
            worst = max(worst, (gr - ref_grads[n]).abs().max().item() / scale)
    return worst


def translation_sample(task, dp_index, shape):
    """The translation task's sample of data-parallel group dp_index: B = 3 sentences, shape (S, T) the
    padded source and target lengths, the target the next tokens (</s> last), support.models.batch's
    padding."""
    from support.models import batch

    S, T = shape
    src, lengths, prev = batch(task, B=3, S=S, T=T, seed=10 + dp_index)
    target = torch.cat([prev[:, 1:], torch.full_like(prev[:, :1], task.target_dictionary.pad())], 1)
    target[:, -1] = torch.where(prev[:, -1].ne(task.target_dictionary.pad()), task.target_dictionary.eos(),
                                target[:, -1])
    return {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(task.target_dictionary.pad()).sum())}
