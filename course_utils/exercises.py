"""Auto-graders for the exercises: run the learner's function on real ranks, compare.

Taught in ``notebooks/00_orientation.ipynb``. :func:`grade_on_ranks` is the engine
every ``check_*`` helper uses: it launches the learner's function on N ranks (several
world sizes, so a hard-coded answer fails), compares each rank's return value with the
expected one and prints, per rank, what is right and what differs. It returns True
only when every rank of every world size is right; it never raises on a wrong answer.

Graders always run gloo ranks on the CPU (:data:`GRADER_BACKEND`), also on a machine with
GPUs: the exercises are CPU-sized toys, and a learner's tensor made without a device
(``torch.tensor([1.0])``, ``torch.empty(n)``) must be graded, not rejected by NCCL, which
only takes tensors on the rank's GPU. The launch line each grader prints says so.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .fmt import GRAD_ATOL, bound, num
from .fmt import show as _show
from .launch import LaunchError, LaunchTimeout, launch

__all__ = ["GRADER_BACKEND", "check_grad_average_hook", "Verdict", "grade_on_ranks", "grade_cases", "compare", "check_rank_sum", "check_gather_squares",
           "check_bytes_per_gpu", "check_smallest_fitting_stage", "smallest_fitting_stage",
           "NotAllowed", "check_all_reduce_from_rs_ag", "check_ring_all_reduce"]




def compare(got, expected, *, atol: float = 1e-6) -> str:
    """'' when ``got`` matches ``expected`` (numbers or tensors, within atol), else why not."""
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"got {_show(got)}, expected a tensor {_show(expected)}"
        if got.shape != expected.shape:
            return f"got shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        if not torch.allclose(got.double(), expected.double(), atol=atol, rtol=0):
            return f"got {_show(got)}, expected {_show(expected)}"
        return ""
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"got {_show(got)}, expected {_show(expected)}"
        return "" if abs(got - expected) <= atol else f"got {_show(got)}, expected {_show(expected)}"
    return "" if got == expected else f"got {_show(got)}, expected {_show(expected)}"


class Verdict:
    """What a ``check_*`` returns: truthy when passed; shows as one line in a notebook."""

    def __init__(self, name: str, passed: bool):
        self.name, self.passed = name, bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"{self.name}: {'PASSED' if self.passed else 'not yet, see the lines above'}"


#: The backend of every grader's ranks, whatever GPUs are visible (see the module docstring).
GRADER_BACKEND = "gloo"


def _launch_or_report(fn: Callable, world_size: int, *args, timeout_s: float):
    """``launch(fn, world_size, *args)`` on gloo CPU ranks; on a failed or hung rank, print
    one friendly line and return None (a learner's bug is reported, never raised)."""
    try:
        return launch(fn, world_size, *args, backend=GRADER_BACKEND, timeout_s=timeout_s)
    except LaunchTimeout as exc:
        print(f"{world_size} ranks: ranks {exc.rank} and maybe others never finished within "
              f"{timeout_s:g} s. Do all ranks call the same collectives in the same order?")
    except LaunchError as exc:
        if exc.exc_type is None:     # killed by a signal (e.g. gloo aborted it): no Python error
            print(f"{world_size} ranks: {str(exc).splitlines()[0]}")
        else:
            print(f"{world_size} ranks: rank {exc.rank} raised {exc.exc_type}: "
                  f"{str(exc).splitlines()[0].split(': ', 1)[-1]}")
    return None


def grade_on_ranks(fn: Callable, expected: Callable[[int, int], object], *,
                   world_sizes: Sequence[int] = (2, 4), name: str = "your function",
                   args: tuple = (), atol: float = 1e-6, timeout_s: float = 30) -> Verdict:
    """Run ``fn(*args)`` on each world size; compare rank r's value with ``expected(r, n)``.

    Prints one line per rank and per world size; returns a :class:`Verdict`
    (truthy when everything matches).
    """
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}: define it with def, then check it.")
        return Verdict(name, False)
    all_right = True
    for n in world_sizes:
        values = _launch_or_report(fn, n, *args, timeout_s=timeout_s)
        if values is None:
            all_right = False
            continue
        wrong = 0
        for rank, value in enumerate(values):
            why = compare(value, expected(rank, n), atol=atol)
            if why:
                wrong += 1
                print(f"  rank {rank}: differs: {why}")
            else:
                print(f"  rank {rank}: right ({_show(value)})")
        all_right &= wrong == 0
        print(f"{n} ranks: {'all right' if not wrong else f'{wrong} of {n} ranks differ'}")
    return Verdict(name, all_right)


# ------------------------------------------------------------------ notebook 00

def check_rank_sum(fn: Callable) -> Verdict:
    """Exercise 00.1: every rank returns the sum over ranks of (rank + 1)."""
    return grade_on_ranks(fn, lambda r, n: float(n * (n + 1) // 2),
                          world_sizes=(2, 4), name="rank_sum")


def check_gather_squares(fn: Callable) -> Verdict:
    """Exercise 00.2: every rank returns the tensor [(r + 1)**2 for r in ranks]."""
    import torch

    return grade_on_ranks(
        fn, lambda r, n: torch.tensor([float((i + 1) ** 2) for i in range(n)]),
        world_sizes=(3, 4), name="gather_squares")


def grade_cases(fn: Callable, cases: Sequence[dict], expected: Callable[..., object], *,
                name: str = "your function", rel: float = 1e-9) -> Verdict:
    """Call ``fn(**case)`` for each case; compare with ``expected(**case)``; print per case.

    For exercises that are plain functions (no ranks), e.g. memory arithmetic.
    """
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}: define it with def, then check it.")
        return Verdict(name, False)
    wrong = 0
    for case in cases:
        args = ", ".join(f"{k}={v!r}" for k, v in case.items())
        want = expected(**case)
        try:
            got = fn(**case)
        except Exception as exc:  # noqa: BLE001 - report, never raise, on a learner's bug
            wrong += 1
            print(f"  {name}({args}): raised {type(exc).__name__}: {exc}")
            continue
        tol = rel * abs(want) if isinstance(want, (int, float)) and not isinstance(want, bool) else 0
        why = compare(got, want, atol=tol)
        if why:
            wrong += 1
            print(f"  {name}({args}): differs: {why}")
        else:
            print(f"  {name}({args}): right ({_show(got)})")
    print(f"{len(cases) - wrong} of {len(cases)} cases right")
    return Verdict(name, wrong == 0)


# ------------------------------------------------------------------ notebook 03

_BYTES_CASES = [
    dict(num_params=7e9, world_size=4, stage=0), dict(num_params=7e9, world_size=4, stage=1),
    dict(num_params=13e9, world_size=8, stage=2), dict(num_params=7.5e9, world_size=64, stage=3),
    dict(num_params=1.5e9, world_size=3, stage=3), dict(num_params=70e9, world_size=1, stage=2),
]


def check_bytes_per_gpu(fn: Callable) -> Verdict:
    """Exercise 03.1: ``fn(num_params, world_size, stage)`` -> model-state bytes per GPU
    for mixed-precision Adam (2 + 2 + 12 bytes per parameter)."""
    from .memory import model_states

    return grade_cases(fn, _BYTES_CASES,
                       lambda num_params, world_size, stage: model_states(
                           num_params, world_size=world_size, stage=stage).total,
                       name="bytes_per_gpu")


_FIT_CASES = [
    dict(model="llama-2-7b", gpus=4, gpu_gb=80, micro_batch=1, seq=2048),
    dict(model="llama-2-7b", gpus=8, gpu_gb=40, micro_batch=2, seq=2048),
    dict(model="llama-2-13b", gpus=8, gpu_gb=80, micro_batch=1, seq=4096),
    dict(model="llama-2-70b", gpus=8, gpu_gb=80, micro_batch=1, seq=4096),
    dict(model="llama-2-70b", gpus=64, gpu_gb=80, micro_batch=1, seq=1024),
    dict(model="gpt2-xl", gpus=1, gpu_gb=40, micro_batch=4, seq=1024),
]


def smallest_fitting_stage(model: str, gpus: int, gpu_gb: float, micro_batch: int, seq: int):
    """Reference for exercise 03.2: the lowest stage whose per-GPU total (mixed recipe,
    flash attention, no recomputation, no offload) fits in ``gpu_gb`` GB; None if none."""
    from .memory import GB, per_gpu

    for stage in (0, 1, 2, 3):
        m = per_gpu(model, world_size=gpus, stage=stage, micro_batch=micro_batch, seq=seq,
                    attention="flash")
        if m.total <= gpu_gb * GB:
            return stage
    return None


def check_smallest_fitting_stage(fn: Callable) -> Verdict:
    """Exercise 03.2: ``fn(model, gpus, gpu_gb, micro_batch, seq)`` -> 0-3 or None."""
    return grade_cases(fn, _FIT_CASES, smallest_fitting_stage, name="smallest_stage")


# ------------------------------------------------------------------ notebook 01

class NotAllowed(RuntimeError):
    """Raised on a rank when an exercise's function calls a collective it must build itself."""


# Collectives the learner may not call (looked up on ``torch.distributed`` at call time).
_REDUCTIONS = ("all_reduce", "all_reduce_coalesced", "reduce")
_NOT_IN_RS_AG = _REDUCTIONS + ("broadcast", "scatter", "gather", "all_to_all", "all_to_all_single",
                               "send", "recv", "isend", "irecv", "batch_isend_irecv")
_NOT_IN_RING = _REDUCTIONS + ("broadcast", "scatter", "gather", "all_to_all", "all_to_all_single",
                              "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
                              "_reduce_scatter_base", "all_gather", "all_gather_single",
                              "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced")


def _exercise_input(rank: int, numel: int, device=None):
    """Rank r's input: ``100*(r+1) + i`` at position i, float32 (sums are exact)."""
    import torch

    return torch.arange(numel, dtype=torch.float32, device=device) + 100.0 * (rank + 1)


def _exercise_sum(world_size: int, numel: int):
    """The all-reduce (sum over ranks) of :func:`_exercise_input`."""
    return sum(_exercise_input(r, numel) for r in range(world_size))


def _run_without(fn: Callable, numel: int, forbidden: tuple, rule: str):
    """Rank side: call ``fn`` on this rank's input while the ``forbidden`` collectives raise.

    Returns what ``fn`` returned, or its (in-place modified) input when it returned None.
    """
    import torch.distributed as dist

    from .launch import rank_device

    def refuse(name):
        def blocked(*args, **kwargs):
            raise NotAllowed(f"dist.{name} is not allowed in this exercise: {rule}")
        return blocked

    saved = {name: getattr(dist, name) for name in forbidden if hasattr(dist, name)}
    tensor = _exercise_input(dist.get_rank(), numel, rank_device())  # the CPU: graders run gloo
    for name in saved:
        setattr(dist, name, refuse(name))
    try:
        result = fn(tensor)
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)
    return tensor if result is None else result


def _grade_sums(fn: Callable, *, numels: Sequence[int], forbidden: tuple, rule: str, name: str) -> Verdict:
    """Grade ``fn(tensor) -> all-reduced tensor`` on 2, 3 and 4 ranks for each size in ``numels``."""
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}: define it with def, then check it.")
        return Verdict(name, False)
    passed = True
    for numel in numels:
        print(f"tensors of {numel} elements (rank r holds 100*(r+1) + i at position i):")
        verdict = grade_on_ranks(_run_without, lambda r, n, numel=numel: _exercise_sum(n, numel),
                                 world_sizes=(2, 3, 4), name=name, args=(fn, numel, forbidden, rule),
                                 atol=0, timeout_s=20)
        passed &= bool(verdict)
    return Verdict(name, passed)


def check_all_reduce_from_rs_ag(fn: Callable) -> Verdict:
    """Exercise 01.1: ``fn(tensor)`` returns the all-reduce (sum over ranks) of ``tensor``,
    built from a reduce-scatter and an all-gather only.

    Checked on 2, 3 and 4 ranks with 10 elements (not a multiple of 3 or 4: pad, then
    strip). The results are compared exactly: the inputs are small integers in float32.
    ``dist.all_reduce`` and the other collectives raise :class:`NotAllowed` meanwhile.
    """
    return _grade_sums(fn, numels=(10,), forbidden=_NOT_IN_RS_AG, name="all_reduce_from_rs_ag",
                       rule="use only reduce-scatter and all-gather")


def check_ring_all_reduce(fn: Callable) -> Verdict:
    """Exercise 01.2: ``fn(tensor)`` sums ``tensor`` over ranks with a ring of
    ``dist.send``/``dist.recv`` (or ``isend``/``irecv``); return the tensor (in place is fine).

    Checked on 2, 3 and 4 ranks with 5, 7 and 13 elements (not multiples of the world
    size; 5 on 4 ranks also catches ``tensor.chunk(n)`` without padding, which then
    returns fewer than n chunks), exactly. Every collective raises :class:`NotAllowed`
    meanwhile.
    """
    return _grade_sums(fn, numels=(5, 7, 13), forbidden=_NOT_IN_RING, name="ring_all_reduce",
                       rule="use only send/recv (or isend/irecv) between neighbours")


# ------------------------------------------------------------------ notebook 02

def _grads_with_hook(hook) -> dict:
    """Rank side of :func:`check_grad_average_hook`: this rank's gradients with ``hook`` on
    every parameter, against one process's gradients on the whole batch (course GPT)."""
    import torch.distributed as dist

    from .model import SyntheticData, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    data = SyntheticData(global_batch=12, seed=0)
    reference = build_model(seed=0)
    reference(*data.batch(0)).backward()
    model = build_model(seed=0)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    model(*data.shard(0, rank, world)).backward()
    got = dict(model.named_parameters())
    missing = [n for n, p in got.items() if p.grad is None]
    worst = max(((got[n].grad - p.grad).abs().max().item() for n, p in reference.named_parameters()
                 if got[n].grad is not None), default=0.0)
    return {"max_abs_diff": worst, "missing": missing}


def check_grad_average_hook(hook: Callable) -> Verdict:
    """Exercise 02.1: ``hook(param)``, registered with ``register_post_accumulate_grad_hook``
    on every parameter, must leave ``param.grad`` equal to the gradient of the global batch
    (the average over ranks). Checked on 2, 3 and 4 ranks against one process, to 1e-6."""
    name = "grad_average_hook"
    if not callable(hook):
        print(f"hook should be a function of one parameter, got {type(hook).__name__}")
        return Verdict(name, False)
    from .model import build_model

    build_model(device="meta")  # pay torch's one-time imports here, not once per forked rank
    all_right = True
    for n in (2, 3, 4):
        values = _launch_or_report(_grads_with_hook, n, hook, timeout_s=30)
        if values is None:
            all_right = False
            continue
        for rank, v in enumerate(values):
            ok = not v["missing"] and v["max_abs_diff"] <= GRAD_ATOL
            all_right &= ok
            why = (f"no gradient for {v['missing'][:2]}" if v["missing"] else
                   f"max |grad - full-batch grad| {bound(v['max_abs_diff'], GRAD_ATOL)}")
            print(f"  rank {rank}: {'right' if ok else 'differs'} ({why})")
    return Verdict(name, all_right)


# ------------------------------------------------------------------ notebooks 04 and 05

_SHARD_CASES = [dict(numel=12, world_size=4, rank=0), dict(numel=10, world_size=4, rank=3),
                dict(numel=10, world_size=4, rank=1), dict(numel=7, world_size=3, rank=2),
                dict(numel=129350, world_size=3, rank=1), dict(numel=5, world_size=8, rank=7),
                dict(numel=1, world_size=1, rank=0)]


def check_shard_bounds(fn: Callable) -> Verdict:
    """Exercise 04.1: ``fn(numel, world_size, rank)`` -> ``(start, stop)`` of rank's shard
    of a flat buffer of ``numel`` elements padded to a multiple of ``world_size``
    (all shards equal, :func:`course_utils.zero.shard_bounds`)."""
    from .zero import shard_bounds

    def as_tuple(numel, world_size, rank):
        return tuple(fn(numel=numel, world_size=world_size, rank=rank))

    return grade_cases(as_tuple, _SHARD_CASES, shard_bounds, name="shard_bounds")


def _exercise_flat(rank: int, numel: int, salt: float):
    """Rank r's flat gradient: small integers + salt, exact in float32 sums."""
    import torch

    return (torch.arange(numel, dtype=torch.float32) % 7 + (rank + 1) * salt)


def _first_difference(got, want, shard: int) -> str:
    """Where two flat tensors first differ, and whose shard that position is in."""
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"expected a tensor of shape {tuple(want.shape)}, got {_show(got)[:80]}"
    bad = (got - want).abs() > 1e-6
    if not bool(bad.any()):
        return ""
    i = int(bad.nonzero()[0])
    return (f"first difference at element {i} (in rank {i // shard}'s shard): got "
            f"{got[i].item():g}, expected {want[i].item():g}; {int(bad.sum())} elements differ")


def _zero1_sgd_rank(fn, numel: int, lr: float):
    """Rank side of :func:`check_zero1_step`."""
    import torch.distributed as dist

    from .zero import padded_numel

    rank, n = dist.get_rank(), dist.get_world_size()
    padded = padded_numel(numel, n)
    flat_param = _exercise_flat(0, padded, 0.5)
    flat_param[numel:] = 0
    flat_grad = _exercise_flat(rank, padded, 1.0)
    flat_grad[numel:] = 0
    out = fn(flat_param, flat_grad, lr)
    return flat_param if out is None else out


def check_zero1_step(fn: Callable) -> Verdict:
    """Exercise 04.2: ``fn(flat_param, flat_grad, lr)``: one ZeRO-1 step with plain SGD.
    Both tensors are padded to a multiple of the world size; reduce-scatter the gradient,
    average it, update only this rank's shard (``p -= lr * g``), all-gather the shards
    into ``flat_param`` (return it, or update it in place). Checked on 2, 3 and 4 ranks
    against ``p - lr * mean over ranks of g``; the first differing element is named."""
    import torch

    from .zero import padded_numel

    name = "zero1_step"
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}")
        return Verdict(name, False)
    numel, lr = 10, 0.25
    all_right = True
    for n in (2, 3, 4):
        padded = padded_numel(numel, n)
        want = _exercise_flat(0, padded, 0.5)
        want[numel:] = 0
        mean = sum(_exercise_flat(r, padded, 1.0) for r in range(n)) / n
        mean[numel:] = 0
        want = want - lr * mean
        values = _launch_or_report(_zero1_sgd_rank, n, fn, numel, lr, timeout_s=20)
        if values is None:
            all_right = False
            continue
        wrong = 0
        for rank, got in enumerate(values):
            why = _first_difference(got, want, padded // n)
            wrong += bool(why)
            print(f"  rank {rank}: {'differs: ' + why if why else 'right'}")
        all_right &= wrong == 0
        print(f"{n} ranks ({numel} elements padded to {padded}): "
              f"{'all right' if not wrong else f'{wrong} of {n} ranks differ'}")
    return Verdict(name, all_right)


def _bucket_rank(fn, sizes):
    """Rank side of :func:`check_reduce_scatter_bucket`."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    params = []
    for i, k in enumerate(sizes):
        p = torch.nn.Parameter(torch.zeros(k))
        p.grad = torch.arange(k, dtype=torch.float32) + 10.0 * (rank + 1) + i
        params.append(p)
    shard = fn(params)
    return shard, [p.grad is None for p in params]


def check_reduce_scatter_bucket(fn: Callable) -> Verdict:
    """Exercise 05.1: ``fn(params)`` -> this rank's shard of the *averaged* gradient of
    the bucket (the ``.grad`` of ``params`` flattened in order, padded with zeros to a
    multiple of the world size), using a reduce-scatter; it must also free every full
    gradient (``p.grad = None``), as ZeRO-2 does. Checked on 2, 3 and 4 ranks with
    buckets of 3 + 4 elements (7: odd) and 5 elements."""
    import torch

    from .zero import padded_numel, shard_bounds

    name = "reduce_scatter_bucket"
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}")
        return Verdict(name, False)
    all_right = True
    for sizes in ((3, 4), (5,)):
        numel = sum(sizes)
        for n in (2, 3, 4):
            flat = torch.zeros(padded_numel(numel, n))
            for r in range(n):
                flat[:numel] += torch.cat([torch.arange(k, dtype=torch.float32) + 10.0 * (r + 1) + i
                                           for i, k in enumerate(sizes)])
            flat /= n
            values = _launch_or_report(_bucket_rank, n, fn, sizes, timeout_s=20)
            if values is None:
                all_right = False
                continue
            wrong = 0
            for rank, (shard, freed) in enumerate(values):
                lo, hi = shard_bounds(numel, n, rank)
                why = compare(shard, flat[lo:hi])
                if not why and not all(freed):
                    why = "the full gradients were not freed (set p.grad = None)"
                wrong += bool(why)
                print(f"  rank {rank}: {'differs: ' + why if why else 'right'}")
            all_right &= wrong == 0
            print(f"bucket {list(sizes)} on {n} ranks: "
                  f"{'all right' if not wrong else f'{wrong} of {n} ranks differ'}")
    return Verdict(name, all_right)


__all__ += ["check_shard_bounds", "check_zero1_step", "check_reduce_scatter_bucket"]


# ------------------------------------------------------------------ notebook 06

def _zero3_weight(numel: int):
    """The full weight of exercise 06.1 (flat, unpadded): the same on every rank."""
    import torch

    return (torch.arange(numel, dtype=torch.float32) % 7 - 3) / 4


def _alive_after(refs, gc, patience_s: float = 1.0) -> int:
    """How many weakly referenced gathered buffers still hold memory. The backend's work
    object may keep the output alive for a moment after the collective returns (gloo
    releases it from its worker thread), so a buffer counts as kept only if it is still
    alive after ``patience_s``."""
    import time

    def count():
        gc.collect()
        return sum(1 for ref in refs if ref() is not None and ref().untyped_storage().nbytes() > 0)

    deadline = time.monotonic() + patience_s
    alive = count()
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = count()
    return alive


def _zero3_forward_on_rank(fn: Callable) -> list:
    """Rank side of :func:`check_zero3_forward`: run ``fn`` on this rank's shard of a few
    odd-sized Linear weights; report the output's first wrong element, how many
    all-gathers it issued and whether the gathered buffer outlived the call."""
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list = []

    def spy(original):
        def wrapper(output, *args, **kwargs):
            outs = output if isinstance(output, (list, tuple)) else [output]
            gathered.extend(weakref.ref(t) for t in outs)
            return original(output, *args, **kwargs)
        return wrapper

    names = [n for n in ("all_gather_single", "all_gather_into_tensor", "all_gather") if hasattr(dist, n)]
    saved = {n: getattr(dist, n) for n in names}
    report = []
    try:
        for n in names:
            setattr(dist, n, spy(saved[n]))
        for shape in ((3, 5), (4, 7), (2, 9)):
            numel = shape[0] * shape[1]
            padded = -(-numel // world) * world
            flat = torch.zeros(padded)
            flat[:numel] = _zero3_weight(numel)
            size = padded // world
            shard = flat[rank * size:(rank + 1) * size].clone()
            x = torch.linspace(-1, 1, 2 * shape[1]).reshape(2, shape[1]) + rank
            expected = x @ flat[:numel].view(shape).T
            gathered.clear()
            with torch.no_grad():
                got = fn(shard, numel, shape, x)
            alive = _alive_after(gathered, gc)
            first = ""
            if not isinstance(got, torch.Tensor):
                first = f"returned {type(got).__name__}, expected a tensor of shape {tuple(expected.shape)}"
            elif got.shape != expected.shape:
                first = f"output shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            else:
                bad = ((got - expected).abs() > 1e-5).nonzero()
                if len(bad):
                    i, j = bad[0].tolist()
                    first = (f"first difference at out[{i}, {j}]: got {got[i, j].item():.6g}, "
                             f"expected {expected[i, j].item():.6g}")
            report.append({"shape": shape, "first_diff": first, "gathers": len(gathered),
                           "alive": alive})
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
    return report


def check_zero3_forward(fn: Callable) -> Verdict:
    """Exercise 06.1: ``fn(shard, numel, shape, x)`` is a ZeRO-3 Linear forward (no bias).

    ``shard`` is this rank's chunk of the weight flattened and zero-padded to a multiple
    of the world size; ``fn`` must all-gather the full flat weight (one collective),
    drop the padding, view it as ``shape``, return ``x @ W.T`` and free the gathered
    buffer (nothing of it may stay alive after the call). Checked on 2, 3 and 4 ranks
    with 15-, 28- and 18-element weights (padding needed), exactly (1e-5)."""
    name = "zero3_forward"
    if not callable(fn):
        print(f"zero3_forward should be a function (shard, numel, shape, x), got {type(fn).__name__}")
        return Verdict(name, False)
    all_right = True
    for n in (2, 3, 4):
        values = _launch_or_report(_zero3_forward_on_rank, n, fn, timeout_s=30)
        if values is None:
            all_right = False
            continue
        wrong = 0
        for rank, cases in enumerate(values):
            problems = []
            for c in cases:
                if c["first_diff"]:
                    problems.append(f"weight {c['shape']}: {c['first_diff']}")
                elif c["gathers"] != 1:
                    problems.append(f"weight {c['shape']}: {c['gathers']} all-gathers, expected exactly 1 "
                                    "(gather the whole flat weight at once)")
                elif c["alive"]:
                    problems.append(f"weight {c['shape']}: the gathered weight is still alive after "
                                    "forward; ZeRO-3 frees it (do not keep it in a global or attribute)")
            if problems:
                wrong += 1
                print(f"  rank {rank}: differs: {problems[0]}")
            else:
                print(f"  rank {rank}: right (gathered, computed, freed for {len(cases)} weights)")
        all_right &= wrong == 0
        print(f"{n} ranks: {'all right' if not wrong else f'{wrong} of {n} ranks differ'}")
    return Verdict(name, all_right)


__all__ += ["check_zero3_forward"]


# ------------------------------------------------------------------ notebook 07

def _single_grads(k_micro: int = 1, max_norm: float | None = None):
    """One process, whole global batch of step 0: (loss, total grad norm, {name: grad}) of
    the course GPT, the reference the notebook-07 graders compare with."""
    import torch

    from .experiments import GLOBAL_BATCH
    from .model import SyntheticData, build_model

    model = build_model(seed=0)
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, 0, 1)
    loss = model(x, y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm else float("inf"))
    return loss.item(), norm.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _full_grads(model) -> dict:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters() if p.grad is not None}


def _grad_problem(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-7) -> str:
    """'' when every gradient matches, else the first parameter that differs and by how much."""
    import torch

    for name, w in want.items():
        g = got.get(name)
        if g is None:
            return f"{name} has no gradient"
        if not torch.allclose(g, w, rtol=rtol, atol=atol):
            return (f"{name}: largest difference {(g - w).abs().max().item():.3g} "
                    f"(gradient norm {w.norm().item():.3g})")
    return ""


def _fsdp_wrap_on_rank(fn: Callable) -> dict:
    """Rank side of :func:`check_fsdp_wrap`."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from .comm import CommLedger
    from .experiments import GLOBAL_BATCH, global_loss
    from .model import SyntheticData, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(seed=0)
    out = fn(model)
    model = model if out is None else out
    units = [name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, rank, world)
    with CommLedger() as ledger:
        loss = model(x, y)
        loss.backward()
    return {"units": units, "blocks": blocks, "counts": ledger.counts(),
            "loss": global_loss(loss)}


def check_fsdp_wrap(fn: Callable) -> Verdict:
    """Exercise 07.1: ``fn(model)`` shards the course GPT the way FSDP1's
    ``transformer_auto_wrap_policy`` with ``transformer_layer_cls={Block}`` would: one
    ``fully_shard`` per block, then one on the root (returns the model or None).
    Checked on 2 and 3 ranks: the FSDP units, the all-gathers and reduce-scatters of one
    forward + backward (9 and 5), and the loss of one process on the global batch."""
    name = "fsdp_wrap"
    if not callable(fn):
        print(f"fsdp_wrap should be a function (model) -> model, got {type(fn).__name__}")
        return Verdict(name, False)
    loss, _, _ = _single_grads()
    all_right = True
    for n in (2, 3):
        values = _launch_or_report(_fsdp_wrap_on_rank, n, fn, timeout_s=60)
        if values is None:
            all_right = False
            continue
        v = values[0]
        problems = []
        missing = [b for b in v["blocks"] if b not in v["units"]]
        extra = [u for u in v["units"] if u not in v["blocks"] and u != "<root>"]
        if "<root>" not in v["units"]:
            problems.append("the root is not sharded: the embeddings and final norm stay whole on "
                            "every rank (call fully_shard(model) last)")
        if missing:
            problems.append(f"not sharded on their own: {', '.join(missing)}")
        if extra:
            problems.append(f"sharded too finely: {', '.join(extra[:3])}"
                            f"{' ...' if len(extra) > 3 else ''} (one unit per block is enough)")
        if not problems and v["counts"].get("all_gather") != 9:
            problems.append(f"{v['counts'].get('all_gather')} all-gathers in one forward + backward, "
                            "expected 9 (use the default reshard_after_forward=True on the blocks)")
        if not problems and abs(v["loss"] - loss) > 1e-6 * abs(loss):
            problems.append(f"loss {v['loss']:.7g}, one process gives {loss:.7g}")
        if problems:
            all_right = False
            for p in problems:
                print(f"{n} ranks: differs: {p}")
        else:
            print(f"{n} ranks: right: units {', '.join(v['units'])}; "
                  f"{v['counts']['all_gather']} all-gathers, {v['counts']['reduce_scatter']} "
                  f"reduce-scatters; loss {num(v['loss'])} = one process (rel. "
                  f"{bound(abs(v['loss'] - loss) / abs(loss), 1e-6)})")
    return Verdict(name, all_right)


def _clip_on_rank(fn: Callable, max_norm: float) -> dict:
    """Rank side of :func:`check_sharded_clip`: the course GPT under "torch-fsdp", one
    backward on this rank's rows, then the learner's clipping."""
    import torch.distributed as dist

    from .experiments import GLOBAL_BATCH, make_adamw, wrap
    from .model import SyntheticData, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    model, _ = wrap("torch-fsdp", build_model(seed=0), make_adamw)
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, rank, world)
    model(x, y).backward()
    norm = fn(model, max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    norm = float(norm) if norm is not None else None
    return {"norm": norm, "grads": {k: v.tolist() for k, v in _full_grads(model).items()}}


def check_sharded_clip(fn: Callable) -> Verdict:
    """Exercise 07.2: ``fn(model, max_norm)`` clips the sharded gradients of an FSDP2 model
    to a *global* norm of ``max_norm`` and returns the norm before clipping. Checked on
    2 and 3 ranks against one process clipping the whole gradient (1e-5 relative)."""
    import torch

    name = "sharded_clip"
    if not callable(fn):
        print(f"sharded_clip should be a function (model, max_norm) -> norm, got {type(fn).__name__}")
        return Verdict(name, False)
    max_norm = 0.5
    _, norm, grads = _single_grads(max_norm=max_norm)
    all_right = True
    for n in (2, 3):
        values = _launch_or_report(_clip_on_rank, n, fn, max_norm, timeout_s=60)
        if values is None:
            all_right = False
            continue
        wrong = 0
        for rank, v in enumerate(values):
            if v["norm"] is None:
                wrong += 1
                print(f"  rank {rank}: differs: returned None; return the total norm before "
                      f"clipping (one process gets {num(norm)})")
                continue
            if abs(v["norm"] - norm) > 1e-5 * norm:
                wrong += 1
                print(f"  rank {rank}: differs: returned norm {v['norm']}, the global norm is "
                      f"{num(norm)} (a norm of the local shards only is smaller and differs per rank)")
                continue
            why = _grad_problem({k: torch.tensor(g) for k, g in v["grads"].items()}, grads)
            if why:
                wrong += 1
                print(f"  rank {rank}: norm right, clipped gradients differ: {why}")
            else:
                print(f"  rank {rank}: right (norm {num(v['norm'])} = one process's, "
                      f"gradients scaled by {num(max_norm / norm)})")
        all_right &= wrong == 0
        print(f"{n} ranks: {'all right' if not wrong else f'{wrong} of {n} ranks differ'}")
    return Verdict(name, all_right)


def _accumulate_on_rank(fn: Callable, k: int) -> dict:
    """Rank side of :func:`check_accumulation`."""
    import torch.distributed as dist

    from .comm import CommLedger
    from .experiments import GLOBAL_BATCH, make_adamw, wrap
    from .model import SyntheticData, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    model, _ = wrap("torch-fsdp", build_model(seed=0), make_adamw)
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, rank, world)
    micro = list(zip(x.chunk(k), y.chunk(k)))
    with CommLedger() as ledger:
        fn(model, micro)
    return {"counts": ledger.counts(), "grads": {n: g.tolist() for n, g in _full_grads(model).items()}}


def check_accumulation(fn: Callable) -> Verdict:
    """Exercise 07.3: ``fn(model, micro_batches)`` runs forward + backward on each
    ``(x, y)`` of this rank's micro-batches of an FSDP2 model so that the gradients are
    reduce-scattered once, after the last one (``set_requires_gradient_sync``), and end
    equal to the full-batch gradient (scale each micro-batch's loss by 1/k). Checked on
    2 ranks with k = 2 and 3 micro-batches: 5 reduce-scatters (one per unit), gradients
    within 1e-5 relative of one process on the whole batch."""
    import torch

    name = "accumulation"
    if not callable(fn):
        print(f"accumulation should be a function (model, micro_batches), got {type(fn).__name__}")
        return Verdict(name, False)
    _, _, grads = _single_grads()
    all_right = True
    for k in (2, 3):
        values = _launch_or_report(_accumulate_on_rank, 2, fn, k, timeout_s=60)
        if values is None:
            all_right = False
            continue
        v = values[0]
        rs = v["counts"].get("reduce_scatter", 0)
        problems = []
        if rs != 5:
            problems.append(f"{rs} reduce-scatters, expected 5 (one per unit, only after the last "
                            f"micro-batch; turn gradient sync off for the first {k - 1})")
        why = _grad_problem({n: torch.tensor(g) for n, g in v["grads"].items()}, grads)
        if why:
            problems.append(f"gradients differ from the full batch's: {why}")
        if problems:
            all_right = False
            for p in problems:
                print(f"k = {k} micro-batches on 2 ranks: differs: {p}")
        else:
            print(f"k = {k} micro-batches on 2 ranks: right: {rs} reduce-scatters, gradients = "
                  "full batch")
    return Verdict(name, all_right)


__all__ += ["check_fsdp_wrap", "check_sharded_clip", "check_accumulation"]
