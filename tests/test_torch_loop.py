"""The course's DDP and ZeRO in an ordinary torch training loop (issue: optimizers are
``torch.optim.Optimizer``, parameter groups, LR schedulers, clipping between backward and
step), against one process running the same loop on the global batch."""
import copy

import pytest
import torch

from course_utils.harness import experiments as ex
from course_utils.harness.model import SyntheticData, build_model
from course_utils.impl.zero import Zero1
from course_utils.runtime.launch import launch

STEPS, MAX_NORM, LR, SGD_LR = 3, 0.5, 1e-3, 0.1
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
# AdamW divides by sqrt(v): the float noise of a different summation order (ranks vs one
# batch) grows to ~2e-5 in 3 steps on near-zero gradients; torch's own DDP and FSDP2 show
# the same 2.1e-5 here. Bitwise equality across ranks is checked elsewhere.
ATOL = 5e-5
# Mixed precision, SGD (lr 0.1, momentum), 3 steps. On 1 rank ZeRO-3 casts and computes as
# one process on one thread does: bit for bit. On 2-3 ranks
# each rank's low-precision gradient of its rows is summed in fp32 where one process
# computes the whole batch's in low precision: measured up to 1.9e-4 (bf16, 3 ranks),
# the size of the low-precision rounding itself.
MIXED_ATOL_ONE_RANK, MIXED_ATOL = 0.0, 5e-4
# ... without clipping: a norm summed in another order changes a master weight in its last
# bit, which can flip its rounding to bf16, a whole bf16 ulp; clip_grad_norm_ still runs,
# with a bound so high its factor is exactly 1.
NO_CLIP = 1e9


def _groups(params):
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def two_groups(params):
    """AdamW with weight decay 0.1 on matrices and 0.0 on vectors (biases, norms)."""
    return torch.optim.AdamW(_groups(params), lr=LR)


def two_groups_sgd(params):
    """SGD with momentum, same groups: its update is proportional to the gradient, so a
    difference in the gradients shows as it is (AdamW's sqrt(v) would magnify noise)."""
    return torch.optim.SGD(_groups(params), lr=SGD_LR, momentum=0.9)


def schedule(step):
    return 1.0 / (1 + step)


def _loop(strategy, rank=0, world=1, make=two_groups, max_norm=MAX_NORM, **options):
    model = build_model(seed=0)
    dtypes = set()                  # what the first Linear computes with, forward by forward
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda m, args, out: dtypes.add((m.weight.dtype, out.dtype)))
    model, opt = ex.wrap(strategy, model, make, **options)
    assert isinstance(opt, torch.optim.Optimizer), type(opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    data = SyntheticData(global_batch=ex.GLOBAL_BATCH, seed=0)
    norms, lrs = [], []
    for step in range(STEPS):
        loss = model(*data.shard(step, rank, world))
        loss.backward()
        norms.append(float(ex.clip_grad_norm_(model, max_norm)))
        opt.step()                      # the real optimizer's groups stepped with the scheduled lr
        lrs.append([g["lr"] for g in getattr(opt, "inner", opt).param_groups])
        sched.step()
        opt.zero_grad()
    return {"norms": norms, "lrs": lrs, "params": ex.full_parameters(model), "dtypes": dtypes}


def _mixed_reference(dtype):
    """One process: fp32 master weights; each step a copy cast to ``dtype`` computes the
    forward and backward on the global batch, its gradients (in fp32) step the masters.
    On one thread, as the ranks: low-precision products may be blocked by thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _mixed_reference_steps(dtype)
    finally:
        torch.set_num_threads(threads)


def _mixed_reference_steps(dtype):
    master = build_model(seed=0)
    opt = two_groups_sgd(master.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    data = SyntheticData(global_batch=ex.GLOBAL_BATCH, seed=0)
    for step in range(STEPS):
        compute = copy.deepcopy(master).to(dtype)
        compute(*data.batch(step)).backward()
        for pm, pc in zip(master.parameters(), compute.parameters()):
            pm.grad = pc.grad.float()
        torch.nn.utils.clip_grad_norm_(master.parameters(), NO_CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in master.named_parameters()}


def _mixed(rank, world_size):
    return {dtype: _loop("zero3", rank, world_size, two_groups_sgd, NO_CLIP, param_dtype=dtype,
                         reduce_dtype=torch.float32) for dtype in (torch.bfloat16, torch.float16)}


def _on_ranks(rank, world_size):
    out = {s: _loop(s, rank, world_size) for s in STRATEGIES}
    out["mixed"] = _mixed(rank, world_size)
    # a Zero1's state dict is this rank's shard; it loads into the same layout only
    model = build_model(seed=0)
    opt = Zero1(model.parameters(), torch.optim.AdamW, lr=LR)
    model(*SyntheticData(global_batch=ex.GLOBAL_BATCH, seed=0).shard(0, rank, world_size)).backward()
    opt.step()
    again = Zero1(build_model(seed=1).parameters(), torch.optim.AdamW, lr=0.5)
    again.load_state_dict(opt.state_dict())
    out["state_dict_equal"] = again.param_groups[0]["lr"] == LR and all(
        torch.equal(a, b) for sa, sb in zip(opt.inner.state.values(), again.inner.state.values())
        for a, b in zip(sa.values(), sb.values()))
    errors = []
    for make in (lambda: Zero1(model, torch.optim.AdamW),
                 lambda: Zero1(model.parameters(), torch.optim.AdamW(model.parameters())),
                 lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]}),
                 lambda: again.load_state_dict({**opt.state_dict(), "buckets": [(1, 2)]}),
                 lambda: ex.wrap("zero1", build_model(), lambda ps: object()),
                 lambda: ex.clip_grad_norm_(model, 0)):
        try:
            make()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - the test reads the type and message
            errors.append(f"{type(exc).__name__}: {exc}")
    out["errors"] = errors
    return out


@pytest.fixture(scope="module")
def single():
    return _loop("single")


@pytest.fixture(scope="module")
def ranks():
    """Every strategy's loop on 2 and on 3 ranks: one launch per world size."""
    out = {n: launch(_on_ranks, n, quiet=True) for n in (2, 3)}
    out[1] = [{"mixed": per} for per in launch(_mixed, 1, quiet=True)]
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_ordinary_loop_matches_one_process(world_size, single, ranks):
    assert all(n > MAX_NORM for n in single["norms"])                 # the clipping binds
    out = ranks[world_size]
    for rank, per in enumerate(out):
        for s in STRATEGIES:
            got = per[s]
            assert got["norms"] == pytest.approx(single["norms"], rel=1e-5), s
            assert got["lrs"] == [[LR * schedule(k)] * 2 for k in range(STEPS)], s   # every group, every step
            for name, t in single["params"].items():
                torch.testing.assert_close(got["params"][name], t, rtol=0, atol=ATOL, msg=f"{s} {name}")
                assert torch.equal(got["params"][name], out[0][s]["params"][name])   # same on every rank
        assert per["state_dict_equal"]
        errors = per["errors"]
        assert errors[0].startswith("TypeError: Zero1 takes parameters")
        assert errors[1].startswith("TypeError: optimizer_class must be a torch.optim.Optimizer class")
        assert errors[2].startswith("NotImplementedError: Zero1 lays out")
        assert errors[3].startswith("ValueError: this state dict is the shard of another layout")
        assert errors[4].startswith("TypeError: make_optimizer must return a torch.optim.Optimizer")
        assert errors[5].startswith("ValueError: max_norm must be > 0")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_zero3_mixed_precision_matches_one_process_casting_the_same_way(dtype, ranks):
    ref = _mixed_reference(dtype)
    for n, out in ranks.items():
        for per in out:
            got = per["mixed"][dtype]
            assert got["dtypes"] == {(dtype, dtype)}                            # computed in low precision
            assert all(t.dtype == torch.float32 for t in got["params"].values())  # fp32 masters
            worst = max((got["params"][k] - ref[k]).abs().max().item() for k in ref)
            assert worst <= (MIXED_ATOL_ONE_RANK if n == 1 else MIXED_ATOL), (n, worst)
