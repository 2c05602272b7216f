"""ls_adam: fairseq's `adam` numbers and state through fairseq's own optimizer classes (no mocks).

Configs are parsed by fairseq's real command-line parser, optimizers are built with
fairseq.optim.build_optimizer / FP16Optimizer / MemoryEfficientFP16Optimizer / AMPOptimizer as the
trainer builds them, and each step follows the trainer: backward, multiply_grads, clip_grad_norm,
step, zero_grad.
"""
import copy
import functools
import warnings

import pytest
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_lightseq.ops import _backend, reference
from fairseq_lightseq.optim import FusedAdam, LSAdam

HAS_CUDA = torch.cuda.is_available()
MODE_ARGS = {
    "fp32": (),
    # fairseq flattens fp16 master params only on CUDA (it calls torch.cuda.current_device()).
    "fp16": ("--fp16",) if HAS_CUDA else ("--fp16", "--fp16-no-flatten-grads"),
    "memory_efficient_fp16": ("--fp16", "--memory-efficient-fp16"),
    "bf16": ("--bf16",),
    "amp": ("--amp",),
}
MODEL_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "memory_efficient_fp16": torch.float16,
               "bf16": torch.bfloat16, "amp": torch.float32}


@functools.lru_cache(maxsize=None)
def make_cfg(optimizer, mode="fp32", extra=()):
    parser = options.get_training_parser()
    argv = ["/unused-data-dir", "--arch", "transformer", "--task", "translation", "--optimizer", optimizer,
            "--lr", "1e-3", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-8", "--weight-decay", "0.01",
            "--fp16-init-scale", "128", *MODE_ARGS[mode], *extra]
    args = options.parse_args_and_arch(parser, argv)
    return convert_namespace_to_omegaconf(args)


def build(optimizer, params, mode="fp32", extra=()):
    """The optimizer the fairseq trainer would build for this precision mode."""
    cfg = make_cfg(optimizer, mode, tuple(extra))
    params = [p for p in params if p.requires_grad]
    if mode == "fp32":
        return optim.build_optimizer(cfg.optimizer, params)
    if mode == "memory_efficient_fp16":
        return optim.MemoryEfficientFP16Optimizer.build_optimizer(cfg, params)
    if mode == "amp":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GradScaler disables itself without CUDA
            return optim.AMPOptimizer.build_optimizer(cfg, params)
    return optim.FP16Optimizer.build_optimizer(cfg, params)


def make_model(dtype=torch.float32, device="cpu", seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 33), torch.nn.LayerNorm(33), torch.nn.ReLU(),
                                torch.nn.Linear(33, 5))
    return model.to(device=device, dtype=dtype)


def batch(i, dtype, device="cpu"):
    g = torch.Generator().manual_seed(1000 + i)
    x = torch.randn(16, 8, generator=g)
    y = torch.randn(16, 5, generator=g)
    return x.to(device=device, dtype=dtype), y.to(device)


def train_step(opt, model, i, clip_norm=0.0, corrupt=None):
    """One update as fairseq's trainer does it. corrupt(model) may poison grads after backward."""
    dtype = next(model.parameters()).dtype
    x, y = batch(i, dtype, next(model.parameters()).device)
    loss = ((model(x).float() - y) ** 2).sum()
    opt.backward(loss)
    if corrupt is not None:
        corrupt(model)
    opt.multiply_grads(1.0 / x.shape[0])
    try:
        opt.clip_grad_norm(clip_norm)
        opt.step()
    finally:
        opt.zero_grad()


def params_of(model):
    return [p.detach().float().clone() for p in model.parameters()]


def assert_params_close(a, b, rtol, atol):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def state_tensors(opt):
    return [t.clone() for s in opt.optimizer.state.values() for k, t in sorted(s.items()) if torch.is_tensor(t)]


def test_registered_and_built_through_fairseq():
    opt = build("ls_adam", make_model().parameters())
    assert isinstance(opt, LSAdam) and isinstance(opt.optimizer, FusedAdam)
    assert opt.optimizer_config == build("adam", make_model().parameters()).optimizer_config
    assert opt.supports_memory_efficient_fp16 and opt.supports_flat_params and opt.supports_step_with_scale


@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
def test_100_steps_match_fairseq_adam_fp32(clip_norm):
    ref_model, ls_model = make_model(), make_model()
    ref_opt, ls_opt = build("adam", ref_model.parameters()), build("ls_adam", ls_model.parameters())
    for i in range(100):
        train_step(ref_opt, ref_model, i, clip_norm)
        train_step(ls_opt, ls_model, i, clip_norm)
    assert_params_close(params_of(ls_model), params_of(ref_model), rtol=1e-5, atol=1e-6)
    assert_params_close(state_tensors(ls_opt), state_tensors(ref_opt), rtol=1e-5, atol=1e-7)
    assert all(s["step"] == 100 for s in ls_opt.optimizer.state.values())


# Low-precision params round to their dtype after every step: allow a few of its ulps at |p| ~ 1.
@pytest.mark.parametrize("mode,atol", [("fp16", 4e-3), ("memory_efficient_fp16", 4e-3), ("bf16", 3e-2),
                                       ("amp", 1e-5)])
def test_mixed_precision_matches_fairseq_adam(mode, atol):
    dtype = MODEL_DTYPE[mode]
    ref_model, ls_model = make_model(dtype), make_model(dtype)
    ref_opt, ls_opt = build("adam", ref_model.parameters(), mode), build("ls_adam", ls_model.parameters(), mode)
    before = params_of(ls_model)
    for i in range(20):
        train_step(ref_opt, ref_model, i, clip_norm=0.1)
        train_step(ls_opt, ls_model, i, clip_norm=0.1)
    assert_params_close(params_of(ls_model), params_of(ref_model), rtol=0, atol=atol)
    after = params_of(ls_model)
    if hasattr(ls_opt, "fp32_params"):  # FP16Optimizer: the fp32 master params, too
        after = [p.detach().clone() for p in ls_opt.fp32_params]
        assert_params_close(after, [p.detach() for p in ref_opt.fp32_params], rtol=1e-4, atol=1e-5)
    assert max((a - b).abs().max() for a, b in zip(after, before)) > 0.01  # it trained
    for s in ls_opt.optimizer.state.values():
        assert s["exp_avg"].dtype == torch.float32 and s["exp_avg_sq"].dtype == torch.float32


def _continue_after_swap(first, second):
    """Train 10 steps with `first`, move its state_dict into `second` (and the same into a fresh
    `first`), train both 10 more steps and compare."""
    model = make_model()
    opt = build(first, model.parameters())
    for i in range(10):
        train_step(opt, model, i)
    state = copy.deepcopy(opt.state_dict())
    assert set(state["state"][0].keys()) == {"step", "exp_avg", "exp_avg_sq"}
    assert isinstance(state["state"][0]["step"], int)
    m_same, m_other = copy.deepcopy(model), copy.deepcopy(model)
    o_same, o_other = build(first, m_same.parameters()), build(second, m_other.parameters())
    o_same.load_state_dict(copy.deepcopy(state))
    o_other.load_state_dict(copy.deepcopy(state))
    for i in range(10, 20):
        train_step(o_same, m_same, i)
        train_step(o_other, m_other, i)
    assert_params_close(params_of(m_other), params_of(m_same), rtol=1e-6, atol=1e-7)
    assert_params_close(state_tensors(o_other), state_tensors(o_same), rtol=1e-6, atol=1e-8)
    assert all(s["step"] == 20 for s in o_other.optimizer.state.values())


def test_fairseq_adam_state_resumes_in_ls_adam():
    _continue_after_swap("adam", "ls_adam")


def test_ls_adam_state_resumes_in_fairseq_adam():
    _continue_after_swap("ls_adam", "adam")


@pytest.mark.parametrize("mode", ["fp16", "memory_efficient_fp16"])
def test_fp16_overflow_skips_the_step_and_lowers_the_scale(mode):
    model = make_model(torch.float16)
    opt = build("ls_adam", model.parameters(), mode)
    train_step(opt, model, 0, clip_norm=0.1)  # creates the optimizer state
    params, state = params_of(model), state_tensors(opt)
    masters = [p.detach().clone() for p in opt.fp32_params] if mode == "fp16" and not opt.has_flat_params \
        else None
    steps = [s["step"] for s in opt.optimizer.state.values()]
    scale = opt.scaler.loss_scale

    def poison(m):
        m[0].weight.grad[0, 0] = float("inf")

    with pytest.raises(OverflowError):  # the trainer catches it and skips the update
        train_step(opt, model, 1, clip_norm=0.1, corrupt=poison)
    assert opt.scaler.loss_scale < scale
    assert_params_close(params_of(model), params, rtol=0, atol=0)
    assert_params_close(state_tensors(opt), state, rtol=0, atol=0)
    assert [s["step"] for s in opt.optimizer.state.values()] == steps
    if masters is not None:
        assert_params_close([p.detach() for p in opt.fp32_params], masters, rtol=0, atol=0)
    train_step(opt, model, 2, clip_norm=0.1)  # and training goes on
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(params_of(model), params))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_flat_fp16_master_params_on_cuda_match_fairseq_adam():
    ref_model, ls_model = make_model(torch.float16, "cuda"), make_model(torch.float16, "cuda")
    ref_opt, ls_opt = build("adam", ref_model.parameters(), "fp16"), build("ls_adam", ls_model.parameters(), "fp16")
    assert ls_opt.has_flat_params
    for i in range(20):
        train_step(ref_opt, ref_model, i, clip_norm=0.1)
        train_step(ls_opt, ls_model, i, clip_norm=0.1)
    assert_params_close(params_of(ls_model), params_of(ref_model), rtol=0, atol=4e-3)
    torch.testing.assert_close(ls_opt.fp32_params[0].data if not isinstance(ls_opt.fp32_params, dict)
                               else list(ls_opt.fp32_params.values())[0].data,
                               list(ref_opt.fp32_params.values())[0].data, rtol=1e-4, atol=1e-5)


def test_amsgrad_is_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="ls_adam does not implement amsgrad"):
        build("ls_adam", make_model().parameters(), extra=("--amsgrad",))
    with pytest.raises(ValueError, match="amsgrad"):
        FusedAdam(make_model().parameters(), amsgrad=True)


def test_fp16_adam_stats_is_rejected():
    with pytest.raises(ValueError, match="fp16-adam-stats"):
        build("ls_adam", make_model().parameters(), extra=("--fp16-adam-stats",))


def test_use_old_adam_is_accepted_and_ignored():
    assert isinstance(build("ls_adam", make_model().parameters(), extra=("--use-old-adam",)), LSAdam)


def test_without_a_kernel_the_reference_runs_with_one_warning(monkeypatch):
    monkeypatch.setattr(_backend, "has_kernel", lambda op, device_type: False)
    monkeypatch.setattr(_backend, "_warned", set())
    model = make_model()
    ps = [p.detach().clone() for p in model.parameters()]
    opt = build("ls_adam", model.parameters())
    with pytest.warns(RuntimeWarning, match="no compiled cpu kernel for adam_step_"):
        train_step(opt, model, 0)
    grads_model = make_model()
    x, y = batch(0, torch.float32)
    (((grads_model(x) - y) ** 2).sum() / x.shape[0]).backward()
    gs = [p.grad for p in grads_model.parameters()]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    reference.adam_step(ps, gs, ms, vs, 1, 1e-3, 0.9, 0.98, 1e-8, 0.01)
    assert_params_close(params_of(model), ps, rtol=1e-6, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only once
        train_step(opt, model, 1)


def test_closure_and_step_with_scale():
    """FusedAdam.step(closure, scale=s) divides the grads by s (FusedAdam's fairseq contract)."""
    a, b = make_model(), make_model()
    oa, ob = FusedAdam(a.parameters()), FusedAdam(b.parameters())
    x, y = batch(0, torch.float32)

    def closure(model, factor):
        def run():
            loss = ((model(x) - y) ** 2).sum() * factor
            loss.backward()
            return loss
        return run

    assert torch.is_tensor(oa.step(closure(a, 8.0), scale=8.0))
    ob.step(closure(b, 1.0))
    assert_params_close(params_of(a), params_of(b), rtol=1e-5, atol=1e-7)


def test_steady_state_path_matches_the_per_param_path_when_a_grad_is_missing():
    """ls_adam's one-call steady state (ls_adam._ready_group) gives fairseq adam's numbers, also
    around a step where one param has no grad (its step count then lags the others')."""
    torch.manual_seed(0)
    ps = [torch.randn(5, 3, requires_grad=True), torch.randn(7, requires_grad=True)]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    ours = FusedAdam(ps, lr=0.1, betas=(0.9, 0.98), weight_decay=0.01)
    ref = torch.optim.AdamW(qs, lr=0.1, betas=(0.9, 0.98), weight_decay=0.01)
    for i in range(5):
        g = [torch.randn_like(p) for p in ps]
        for p, q, gi in zip(ps, qs, g):
            p.grad, q.grad = gi.clone(), gi.clone()
        if i == 2:  # one param without a grad
            ps[1].grad = qs[1].grad = None
        ours.step()
        ref.step()
        assert bool(ours._ready) == (i in (0, 1))  # kept after steps 0 and 1; never again once steps differ
        for p, q in zip(ps, qs):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert [ours.state[p]["step"] for p in ps] == [5, 4]


@pytest.mark.parametrize("factor", [0.25, "tensor"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_grad_factor_and_clip_match_fairseq(grad_dtype, max_norm, factor):
    """The Trainer's sequence multiply_grads(c) -> clip_grad_norm(max_norm) -> step: ls_adam returns
    fairseq adam's norm (of the multiplied grads) and makes fairseq adam's update, although it never
    multiplies or clips the grads themselves (the factor and the clip coefficient reach the update
    kernel as its grad scale); max_norm 0: the norm only, as the Trainer asks for it every step."""
    def params(seed):
        g = torch.Generator().manual_seed(seed)
        ps = [torch.nn.Parameter(torch.randn(*shape, generator=g).to(grad_dtype)) for shape in ((7, 5), (5,), (3, 4, 2), (1,))]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(grad_dtype)
        return ps

    c = torch.tensor(0.25) if factor == "tensor" else factor
    ours, theirs = params(3), params(3)
    grads_before = [p.grad.clone() for p in ours]
    opts = build("ls_adam", ours), build("adam", theirs)
    norms = []
    for opt in opts:
        opt.multiply_grads(c)
        norms.append(opt.clip_grad_norm(max_norm))
    assert norms[0].dtype == torch.float32
    torch.testing.assert_close(norms[0], norms[1], rtol=1e-6, atol=0)
    if max_norm == 0.5:  # the clip happens
        assert float(norms[1]) > 1
    for a, b in zip(ours, grads_before):  # deferred: the grads are untouched until the update
        assert torch.equal(a.grad, b)
    for opt in opts:
        opt.step()
    tol = {"rtol": 1e-6, "atol": 1e-7} if grad_dtype == torch.float32 else {"rtol": 0, "atol": 1e-2}
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tol)
    # the next step starts from factor 1 again: an update with the raw grads
    for opt, ps in zip(opts, (ours, theirs)):
        opt.zero_grad()
        for p in ps:
            p.grad = torch.ones_like(p)
        assert float(opt.clip_grad_norm(0)) == pytest.approx(float(sum(p.numel() for p in ps)) ** 0.5, rel=1e-6)
        opt.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tol)


def test_zero_grad_factor_zeroes_the_update():
    """multiply_grads(0) (nothing to divide the update's scale by) zeroes the grads, as fairseq's does."""
    ps = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(2)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = build("ls_adam", ps)
    opt.multiply_grads(0.0)
    opt.step()
    assert all(torch.count_nonzero(p.grad) == 0 for p in ps)
    assert all(float(s["exp_avg"].abs().max()) == 0 for s in opt.optimizer.state.values())
