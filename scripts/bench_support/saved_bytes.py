"""Bytes that autograd holds for backward after a forward: what a training step must keep in memory
between forward and backward (device independent; the GPU holds the same tensors).

Counted: every tensor packed by torch.autograd.graph.saved_tensors_hooks during the forward (ATen
ops' saved variables and custom Functions' ctx.save_for_backward), plus tensors a custom Function keeps
as plain ctx attributes (found by walking the graph from the outputs; the hooks do not see those).
Each distinct storage is counted once, by its data pointer, at its full size (untyped_storage().nbytes()):
views of one tensor are not double counted, and a view keeps its whole storage alive. Storages of the
given parameters are left out (they are held anyway: weights, not activations).
"""
import torch


class SavedBytes:
    """Context manager: `with SavedBytes(params) as sb: out = f(...)`, then `sb.finish(out)` and read
    sb.bytes, sb.tensors (distinct storages) and sb.from_ctx (bytes found only as ctx attributes)."""

    def __init__(self, params=()):
        self._skip = {p.untyped_storage().data_ptr() for p in params}
        self._seen = {}  # data_ptr -> (nbytes, shape, dtype) of the first tensor seen on that storage
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.from_ctx = 0

    def _add(self, t) -> int:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr == 0 or ptr in self._skip or ptr in self._seen:
            return 0
        self._seen[ptr] = (st.nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", ""))
        return st.nbytes()

    def _pack(self, t):
        self._add(t)
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False

    def finish(self, *outputs) -> "SavedBytes":
        """Adds tensors held as attributes of custom Functions' ctx in the graph behind `outputs`."""
        stack = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
        visited = set()
        while stack:
            node = stack.pop()
            if node is None or id(node) in visited:
                continue
            visited.add(id(node))
            for value in getattr(node, "__dict__", {}).values():
                items = value if isinstance(value, (tuple, list)) else (value,)
                for v in items:
                    if isinstance(v, torch.Tensor) and not v.is_meta:
                        self.from_ctx += self._add(v)
            stack.extend(fn for fn, _ in node.next_functions)
        return self

    @property
    def bytes(self) -> int:
        return sum(v[0] for v in self._seen.values())

    def groups(self, top: int = 12):
        """The largest (shape, dtype) groups of saved storages: [(bytes, count, "shape dtype")]: a hint at
        which tensors dominate (e.g. [tokens, vocab] fp32 = logits-sized, [B*H, T, T] = attention)."""
        acc = {}
        for n, shape, dtype in self._seen.values():
            key = f"{'x'.join(map(str, shape))} {dtype}"
            b, c = acc.get(key, (0, 0))
            acc[key] = (b + n, c + 1)
        return sorted(((b, c, k) for k, (b, c) in acc.items()), reverse=True)[:top]

    @property
    def tensors(self) -> int:
        return len(self._seen)


def forward_saved_bytes(args_list, pool_path: str) -> dict:
    """Bytes saved for backward by one training forward (criterion(model, sample), as
    task.train_step runs it, model in train mode so dropout is on) on the pool's first batch."""
    import torch

    from scripts.bench_support.sides import build_model_and_criterion

    task, model, criterion = build_model_and_criterion(args_list)
    sample = torch.load(pool_path, weights_only=False)[0]
    model.train()
    criterion.train()
    with SavedBytes(list(model.parameters()) + list(criterion.parameters())) as sb:
        loss, _, _ = criterion(model, sample)
    sb.finish(loss)
    return {"bytes": sb.bytes, "storages": sb.tensors, "from_ctx_attributes": sb.from_ctx, "largest": sb.groups(),
            "src_tokens": int(sample["net_input"]["src_lengths"].sum()), "tgt_tokens": int(sample["ntokens"]),
            "batch": list(sample["net_input"]["src_tokens"].shape), "dtype": str(next(model.parameters()).dtype)}
