"""Exercise of ``notebooks/06_zero3.ipynb``: a ZeRO-3 flat unit."""
from __future__ import annotations

import contextlib
import gc
import weakref

import torch
import torch.distributed as dist
from torch import nn

from ...impl.common import flatten_and_pad, storage_bytes, trainable
from ...theory.layout import padded_numel
from ...labs.grading import Verdict, carried_over, dist_wrapped, grade_build
from ...runtime.fmt import bound

__all__ = ["check_zero3", "build_units", "zero3_on_rank", "units_on_rank", "check_prefetch", "prefetch_on_rank"]


def _alive_after(refs) -> int:
    """How many weakly referenced gathered buffers still hold memory. No waiting: a buffer
    watched by :func:`_spying_all_gathers` is never held by the backend (gloo's worker thread
    holds its work's tensors a moment after the collective returns), only by the caller."""
    gc.collect()
    return sum(1 for ref in refs if ref() is not None and ref().untyped_storage().nbytes() > 0)


def _ready(t: torch.Tensor) -> bool:
    """``t`` has memory for every element (not freed, e.g. by a forgotten alloc_storage)."""
    return t.untyped_storage().nbytes() >= (t.storage_offset() + t.numel()) * t.element_size()


@contextlib.contextmanager
def _spying_all_gathers(gathered: list):
    """While entered, every all-gather's output tensor(s) go into ``gathered``, weakly. The
    backend gathers into tensors of the spy's own, copied into the caller's once done (an
    ``async_op`` all-gather is done on return), so whether the caller's buffers outlive a
    step depends on the caller's code alone, never on when the backend lets go."""
    def spy(original):
        def wrapper(output, *args, **kwargs):
            outs = list(output) if isinstance(output, (list, tuple)) else [output]
            gathered.extend(weakref.ref(t) for t in outs)
            if not all(isinstance(t, torch.Tensor) and _ready(t) for t in outs):
                return original(output, *args, **kwargs)      # fails as it would unwatched
            mine = [torch.empty_like(t) for t in outs]
            work = original(mine if isinstance(output, (list, tuple)) else mine[0], *args, **kwargs)
            if work is not None:
                work.wait()
            for t, m in zip(outs, mine):
                t.copy_(m)
            return work
        return wrapper
    with dist_wrapped(("all_gather_single", "all_gather_into_tensor", "all_gather"), spy):
        yield gathered


# ------------------------------------------------------------------ exercise 06.1: build ZeRO-3
#: Global batch (divides by 2, 3 and 4), SGD learning rate and steps of exercise 06.1.
BUILD_BATCH, BUILD_LR, BUILD_STEPS = 12, 0.5, 3     # the last step: two micro-batches


class _TiedTwice(nn.Module):
    """One Parameter used twice (``second.weight`` *is* ``first.weight``), two biases."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(5, 5), nn.Linear(5, 5)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def build_units() -> list[nn.Module]:
    """Exercise 06.1's units, the same on every rank: 35, 47 (a frozen norm weight) and 35
    (a tied weight) trainable elements, none divisible by 2, 3 or 4."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        units = [nn.Sequential(nn.Linear(4, 7), nn.Tanh()),
                 nn.Sequential(nn.LayerNorm(7), nn.Linear(7, 5)), _TiedTwice()]
        with torch.no_grad():
            units[1][0].weight.uniform_(0.5, 1.5)
    units[1][0].weight.requires_grad_(False)
    return units


def _close(got, want) -> bool:
    """Equal up to float32 sums split differently (ranks, shards)."""
    return torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def _shard_of(tensors, rank: int, world: int):
    flat = flatten_and_pad([t.detach() for t in tensors], world)
    return flat.view(world, -1)[rank], flat


def _held_bytes(tensors) -> int:
    return storage_bytes([t for t in tensors if isinstance(t, torch.Tensor)], set())


def _size_hint(unit: nn.Module, got: int, world: int, full=None) -> str:
    numel = sum(p.numel() for p in trainable(unit))
    padded = padded_numel(numel, world)
    every = sum(p.numel() for p in unit.parameters())
    twice = sum(p.numel() for _, p in unit.named_parameters(remove_duplicate=False) if p.requires_grad)
    if every != numel and got == padded_numel(every, world) // world:
        return ("frozen parameters stay whole on every rank and are never sent: flatten only those "
                "with requires_grad")
    if twice != numel and got == padded_numel(twice, world) // world:
        return "a tied weight is one Parameter: flatten it once (module.parameters() lists it once)"
    if got == numel // world and isinstance(full, torch.Tensor) and full.numel() == padded:
        return (f"self.full is padded to {padded}, but the chunk was sized from the {numel} unpadded "
                f"elements: each rank's chunk is the padded size / N = {padded // world}")
    if got == numel // world:
        return (f"no padding: pad the flat buffer with zeros to a multiple of N ({padded}) so every "
                "rank's chunk has the same size")
    return f"flatten the trainable parameters, pad with zeros to a multiple of N ({padded}), keep chunk r"


def _shard_problem(wrapped, units, rank: int, world: int, when: str) -> str:
    for i, (w, unit) in enumerate(zip(wrapped, units)):
        shard = getattr(w, "shard", None)
        if not isinstance(shard, torch.Tensor):
            return (f"{when}, unit {i}: self.shard is {type(shard).__name__}: keep chunk r of the "
                    "unit's flat, zero-padded trainable parameters as an nn.Parameter")
        if not isinstance(shard, nn.Parameter) and not any(      # (the course's FlatUnit: its Parameters view it)
                q.numel() and q.untyped_storage().data_ptr() == shard.untyped_storage().data_ptr() for q in w.parameters()):
            return (f"{when}, unit {i}: self.shard is a plain tensor, not an nn.Parameter: the optimizer "
                    "updates only what model.parameters() lists, so wrap the chunk's copy in nn.Parameter")
        if shard.numel() and shard.untyped_storage().nbytes() == 0:
            return (f"{when}, unit {i}: self.shard has no memory of its own: it views self.full, which free() "
                    "emptied. The shard must outlive the full buffer: keep a copy of chunk r (.clone())")
        want, flat = _shard_of(trainable(unit), rank, world)
        if shard.numel() != want.numel():
            return (f"{when}, unit {i}: the shard has {shard.numel()} elements, expected "
                    f"{flat.numel()}/{world} = {want.numel()}: "
                    + _size_hint(unit, shard.numel(), world, getattr(w, "full", None)))
        got = shard.detach().reshape(-1)
        if _close(got, want):
            continue
        other = [j for j, chunk in enumerate(flat.view(world, -1)) if _close(got, chunk)]
        if other:
            return f"{when}, unit {i}: rank {rank} keeps chunk {other[0]} of the flat buffer, not chunk {rank}"
        return (f"{when}, unit {i}: the shard differs from chunk {rank} of one process's flat padded "
                f"parameters (module.parameters() order) by up to {(got - want).abs().max().item():.3g}")
    return ""


def _at_rest_problem(model, wrapped, rank: int, expected: int, when: str, fix: str) -> str:
    held = _held_bytes(list(model.parameters()) +
                       [getattr(w, name, None) for w in wrapped for name in ("shard", "full")])
    if held == expected:
        return ""
    return f"{when}, rank {rank} holds {held} B of parameters, expected 4·P/N + frozen = {expected} B: {fix}"


def _forward_problem(out, want, gathers: int, alive: int, units: int, when: str = "") -> str:
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return f"forward{when} returned {got}, expected a tensor of shape {tuple(want.shape)}"
    if not _close(out, want):
        return (f"the output of forward{when} differs from one process's by up to "
                f"{(out - want).abs().max().item():.3g}: gather the full parameters into the module's "
                "views before running it")
    if gathers != units:
        return (f"{gathers} all-gathers in forward{when} for {units} units, expected {units}: one per unit, "
                "the whole flat buffer at once")
    if alive:
        return (f"after forward{when} {alive} gathered buffer(s) still hold memory: ZeRO-3 frees the full "
                "parameters after forward (free_storage)")
    return ""


def _backward_problem(counts: dict, units: int) -> str:
    if counts.get("all_reduce", 0):
        return (f"{counts['all_reduce']} all-reduce(s) in backward: ZeRO-3 reduce-scatters each unit's "
                "gradient (a rank keeps only its chunk)")
    if counts.get("all_gather", 0) != units:
        return (f"{counts.get('all_gather', 0)} all-gathers in backward for {units} units, expected {units}: "
                "re-gather each unit before the unit's backward")
    if counts.get("reduce_scatter", 0) != units:
        return (f"{counts.get('reduce_scatter', 0)} reduce-scatters in backward for {units} units, expected "
                f"{units}: one per unit, once all its gradients are in")
    return ""


def _grad_problem(model, wrapped, units, ref_units, rank: int, world: int, shard_bytes: int,
                  second: list | None = None) -> str:
    for i, (w, unit, ref) in enumerate(zip(wrapped, units, ref_units)):
        frozen = [n for n, p in unit.named_parameters() if not p.requires_grad and p.grad is not None]
        if frozen:
            return (f"unit {i}: frozen {frozen[0]} got a gradient: a frozen parameter stays whole, out of "
                    "the flat buffer and its gradient")
        grad = getattr(getattr(w, "shard", None), "grad", None)
        if grad is None:
            return (f"unit {i}: after backward, shard.grad is None: reduce-scatter the unit's flat gradient "
                    "into a shard-sized tensor, divide by N, set it as self.shard.grad")
        want, _ = _shard_of([p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable(ref)],
                            rank, world)
        got = grad.detach().reshape(-1)
        if got.numel() == want.numel() and _close(got, want):
            continue
        if got.numel() == want.numel() and _close(got, world * want):
            return f"unit {i}: the shard gradient is the SUM over the {world} ranks: divide by the world size"
        if got.numel() == want.numel() and world > 1 and _close(got * world, want):
            return (f"unit {i}: the shard gradient is the average divided by {world} again: divide the "
                    "sum by the world size once")
        if second is not None and got.numel() == want.numel() and _close(got, _shard_of(second[i], rank, world)[0]):
            return (f"step {BUILD_STEPS} runs two backwards (micro-batches) before the step: unit {i}'s shard.grad "
                    "is the second's alone: the second backward replaced the shard's gradient instead of "
                    "adding to it")
        worst = (got - want).abs().max().item() if got.numel() == want.numel() else float("nan")
        return (f"unit {i}: after backward, shard.grad differs from chunk {rank} of the global batch's "
                f"flat padded gradient by up to {worst:.3g}")
    held = _held_bytes([p.grad for p in model.parameters()] + [w.shard.grad for w in wrapped])
    if held > shard_bytes:
        return (f"full .grads still held after backward: rank {rank} holds {held} B of gradients, expected "
                f"4·P/N = {shard_bytes} B: set each parameter's .grad to None once reduce-scattered")
    return ""


def _raised(phase: str, exc: Exception) -> str:
    from ...labs.frames import raised_at
    message, at = (str(exc).splitlines()[0] if str(exc) else ""), raised_at(exc)
    if "register a hook on a tensor that doesn't require gradient" in message:
        return (f"{phase}: register_hook raised ({message}): under torch.no_grad() nothing will run "
                "backward, so the output needs no gradient; register the hook only when "
                "out.requires_grad" + at)
    if "storage of size 0" in message:
        kind = phase.rsplit(" ", 1)[-1]
        return {"forward": "forward used a freed parameter (0 bytes of storage): gather into self.full "
                           "itself (alloc_storage, then the all-gather) before running the unit",
                "backward": "backward used a freed parameter (0 bytes of storage): re-gather before the "
                            "unit's backward (a hook on the forward's output)"}.get(
            kind, f"{phase} used a freed parameter (0 bytes of storage)") + at
    return f"{phase} raised {type(exc).__name__}: {message}{at}"


def _second_only(ref_units, x, y, world: int) -> list:
    """Per unit, one process's flat padded gradient of the global batch's second micro-batches
    alone (each rank's rows ``[cut, end)``, weighted as in :func:`zero3_on_rank`): what
    ``shard.grad`` holds when the second backward replaced the first's instead of adding to it."""
    import copy
    units = copy.deepcopy(ref_units)
    for p in (p for u in units for p in u.parameters()):
        p.grad = None
    model, total = nn.Sequential(*units), 0.0
    for r in range(world):
        lo, hi = r * BUILD_BATCH // world, (r + 1) * BUILD_BATCH // world
        cut = lo + (hi - lo) // 2
        total = total + torch.nn.functional.mse_loss(model(x[cut:hi]), y[cut:hi]) * ((hi - cut) / (hi - lo)) / world
    total.backward()
    return [[p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable(u)] for u in units]


def zero3_on_rank(cls, steps: int = BUILD_STEPS, accumulate: int | None = BUILD_STEPS - 1) -> list:
    """Rank side of :func:`check_zero3`: ``[(first problem or '', what was seen)]``; every rank
    runs every step whatever it found (else the others would wait in a collective). Step
    ``accumulate`` (from 0) runs two backwards, of two micro-batches, before the optimizer's step."""
    from ...harness.experiments import global_loss
    from ...labs.frames import raised_at
    from ...runtime.ledger import CommLedger
    rank, world = dist.get_rank(), dist.get_world_size()
    ref_units, units = build_units(), build_units()
    ref = nn.Sequential(*ref_units)
    frozen = sum(4 * p.numel() for p in ref.parameters() if not p.requires_grad)
    shard_bytes = sum(4 * padded_numel(sum(p.numel() for p in trainable(u)), world) // world
                      for u in ref_units)
    seen = {"shard_bytes": shard_bytes, "frozen": frozen, "calls": {}, "losses": [], "ref_losses": []}
    try:
        wrapped = [cls(u) for u in units]
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        return [(f"{cls.__name__}(unit) raised {type(exc).__name__}: {exc}{raised_at(exc)}", seen)]
    model = nn.Sequential(*wrapped)
    problem = (_shard_problem(wrapped, ref_units, rank, world, "after construction") or
               _at_rest_problem(model, wrapped, rank, shard_bytes + frozen, "after construction",
                                "free() gives the full buffer's memory back (free_storage); __init__ ends with self.free()"))
    anyone = torch.tensor([float(bool(problem))])
    dist.all_reduce(anyone)
    if anyone.item() > 0:               # every rank stops here: a wrong shard would hang the first all-gather
        return [(problem, seen)]
    lo, hi = rank * BUILD_BATCH // world, (rank + 1) * BUILD_BATCH // world
    phase = "optimizer construction"
    try:
        opt = torch.optim.SGD(model.parameters(), lr=BUILD_LR)
        ref_opt = torch.optim.SGD(trainable(ref), lr=BUILD_LR)
        for step in range(steps):
            before_step = problem
            g = torch.Generator().manual_seed(1000 + step)
            x, y = torch.randn(BUILD_BATCH, 4, generator=g), torch.randn(BUILD_BATCH, 5, generator=g)
            second = _second_only(ref_units, x, y, world) if step == accumulate else None
            ref_out = ref(x)
            ref_loss = torch.nn.functional.mse_loss(ref_out, y)
            ref_loss.backward()
            cut = lo + (hi - lo) // 2
            micro = [(lo, cut), (cut, hi)] if step == accumulate else [(lo, hi)]
            total = 0.0
            for i, (a, b) in enumerate(micro):
                phase, gathered = "forward" if len(micro) == 1 else f"micro-batch {i + 1}'s forward", []
                with CommLedger() as ledger, _spying_all_gathers(gathered):
                    out = model(x[a:b])
                alive = _alive_after(gathered) if step == 0 else 0
                gathers = ledger.counts().get("all_gather", 0)
                if step == 0:
                    seen["calls"]["forward all_gather"] = gathers
                problem = problem or _forward_problem(out, ref_out[a:b].detach(), gathers, alive, len(units))
                loss = torch.nn.functional.mse_loss(out, y[a:b]) * ((b - a) / (hi - lo))
                phase = "backward" if len(micro) == 1 else f"micro-batch {i + 1}'s backward"
                with CommLedger() as ledger:
                    loss.backward()
                counts = ledger.counts()
                if step == 0:
                    seen["calls"].update({f"backward {k}": v for k, v in counts.items() if v})
                problem = problem or _backward_problem(counts, len(units))
                total = total + loss.detach()
            problem = problem or _grad_problem(model, wrapped, units, ref_units, rank, world, shard_bytes,
                                               second=second)
            if problem and not before_step and step:
                problem = (carried_over(problem, step) if step != accumulate else problem if
                           problem.startswith("step ") else
                           f"the steps of one backward matched one process; step {step + 1}, two "
                           f"backwards (micro-batches) before the step, did not: {problem}")
            seen["losses"].append(global_loss(total))
            seen["ref_losses"].append(ref_loss.item())
            phase = "optimizer.step()"
            if any(p.grad is not None and p.untyped_storage().nbytes() <     # freed: stepping it
                   (p.storage_offset() + p.numel()) * p.element_size()     # would write through
                   for p in model.parameters()):                          # a null pointer
                return [(problem or "optimizer.step() would update a freed parameter that still has a "
                         ".grad: set each parameter's .grad to None once reduce-scattered", seen)]
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()
            problem = problem or _at_rest_problem(
                model, wrapped, rank, shard_bytes + frozen, "at rest after a step",
                "free the full buffer once the unit's gradient is reduce-scattered")
        phase, gathered = "a forward under torch.no_grad() (evaluation)", []
        with torch.no_grad(), CommLedger() as ledger, _spying_all_gathers(gathered):
            out = model(x[lo:hi])
        with torch.no_grad():
            want = ref(x[lo:hi])
        problem = problem or _forward_problem(out, want, ledger.counts().get("all_gather", 0),
                                              _alive_after(gathered), len(units), when=" under torch.no_grad()")
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        return [(problem or _raised(phase, exc), seen)]
    problem = problem or _shard_problem(wrapped, ref_units, rank, world, f"after {steps} SGD steps")
    worst = max(abs(a - b) for a, b in zip(seen["losses"], seen["ref_losses"]))
    if not problem and not worst <= 1e-5:                 # NaN too
        problem = f"the losses differ from one process's by up to {worst:.3g}"
    seen["loss_diff"] = worst
    return [(problem, seen)]


def _zero3_right(values) -> str:
    seen = values[0][0][1]
    calls = seen["calls"]
    return (f"per step {calls['forward all_gather']} + {calls['backward all_gather']} all-gathers "
            f"(forward, backward) and {calls['backward reduce_scatter']} reduce-scatters for "
            f"{len(build_units())} units; rank 0 holds 4·P/N = {seen['shard_bytes']} B of params at rest "
            f"(+ {seen['frozen']} B frozen), full buffers and grads freed; shard grads (step {BUILD_STEPS}: "
            f"two backwards added), weights and losses = one process (|diff| {bound(seen['loss_diff'], 1e-5)})")


def check_zero3(cls, *, timeout_s: float = 30, world_sizes=(2, 3, 4)) -> Verdict:
    """Exercise 06.1: ``cls(unit)`` is one ZeRO-3 flat unit (``shard``, ``shard.grad``, ``full``)."""
    return grade_build("zero3", "MyFlatUnit", cls, zero3_on_rank, right=_zero3_right, timeout_s=timeout_s,
                       world_sizes=world_sizes)


def units_on_rank(cls, steps: int = 2) -> dict:
    """``cls`` measured on the whole course model: each of its blocks ``cls(block)`` and the root
    (embeddings, final norm) one more ``cls`` (:class:`~course_utils.harness.units.UnitModel`), SGD
    on the global batch of 12 beside one process. Returns what this rank holds, sends and frees,
    and the losses."""
    from ...harness.experiments import global_loss
    from ...harness.model import SyntheticData, build_model
    from ...harness.units import UnitModel
    from ...runtime.ledger import CommLedger
    rank, world = dist.get_rank(), dist.get_world_size()
    ref, model = build_model(seed=0), UnitModel(build_model(seed=0), cls)
    gathered, peaks = [], []
    for unit in model.units[1:]:   # while a block computes: the bytes of every gathered buffer alive
        unit.module.register_forward_hook(lambda *_: peaks.append(_held_bytes([r() for r in gathered])))
    def at_rest():
        return _held_bytes([p for p in model.parameters() if p.requires_grad] +
                           [getattr(u, name, None) for u in model.units for name in ("shard", "full")])
    seen = {"at_rest": at_rest(), "losses": [], "ref_losses": []}
    opt, ref_opt = (torch.optim.SGD(ps, lr=BUILD_LR) for ps in (model.shard_parameters(), ref.parameters()))
    data = SyntheticData(global_batch=BUILD_BATCH, seed=0)
    for step in range(steps):
        ref_loss = ref(*data.batch(step))
        ref_loss.backward()
        with CommLedger() as ledger, _spying_all_gathers(gathered):
            loss = model(*data.shard(step, rank, world))
            loss.backward()
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
        seen["losses"].append(global_loss(loss))
        seen["ref_losses"].append(ref_loss.item())
    seen.update(calls=ledger.counts(), sent=ledger.totals(), peak_gathered=max(peaks),
                after_step=_held_bytes([r() for r in gathered]), at_rest_after=at_rest())
    return seen


# ------------------------------------------------------------ exercise 06.2 (optional): prefetch
class _LateWork:
    """An all-gather's handle whose data lands only when the caller waits for it or asks whether it
    is done (``wait``, ``is_completed``, ``get_future``, ``synchronize``): until then the gathered
    buffer reads NaN, so code that reads it early fails every time, not once in a while."""

    def __init__(self, land):
        self._land, self.landed = land, False

    def _now(self) -> None:
        if not self.landed:
            self.landed = True
            self._land()

    def wait(self, *args, **kwargs) -> bool:
        self._now()
        return True

    def is_completed(self) -> bool:
        self._now()                  # asked: it has arrived by now
        return True

    def synchronize(self) -> None:
        self._now()

    def get_future(self):
        self._now()
        future = torch.futures.Future()
        future.set_result(None)
        return future


class _Mistake(RuntimeError):
    """Raised on every rank alike, before any collective: its message names the learner's mistake."""


@contextlib.contextmanager
def _late_all_gathers(works: list):
    """While entered, an ``async_op`` all-gather (into one tensor or a list) runs at once into
    buffers of its own and returns a :class:`_LateWork` (also put in ``works``) that copies them into
    the caller's output when waited for; meanwhile the output holds NaN. Blocking all-gathers are
    left as they are. Gathering a tensor autograd tracks (a shard not detached) raises
    :class:`_Mistake` on every rank before anything is sent, instead of torch's error on some."""
    def late(original):
        def wrapper(output, input, *args, async_op=False, **kwargs):
            if isinstance(input, torch.Tensor) and input.requires_grad and torch.is_grad_enabled():
                raise _Mistake("the all-gather's input is self.shard itself, a Parameter autograd tracks: "
                               "gather self.shard.detach()")
            outs = list(output) if isinstance(output, (list, tuple)) else [output]
            if not async_op or not all(isinstance(t, torch.Tensor) and _ready(t) for t in outs):
                return original(output, input, *args, async_op=async_op, **kwargs)
            mine = [torch.empty_like(t) for t in outs]
            original(mine if isinstance(output, (list, tuple)) else mine[0], input, *args, **kwargs)
            for t in outs:
                t.fill_(float("nan"))
            def land():
                if not all(_ready(t) for t in outs):         # writing would go through a null pointer
                    raise _Mistake("an all-gather's data arrived after its self.full was freed: a handle "
                                   "waited on belongs to another unit, or came after free() (keep each "
                                   "unit's handle on that unit)")
                for t, m in zip(outs, mine):
                    t.copy_(m)
            work = _LateWork(land)
            works.append(work)
            return work
        return wrapper
    with dist_wrapped(("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather"), late):
        yield works


def _gathered(unit) -> bool:
    full = getattr(unit, "full", None)
    return isinstance(full, torch.Tensor) and full.untyped_storage().nbytes() > 0


def _one_unit_problem(cls) -> str:
    """Exercise 06.2's unit alone: prefetch, a second prefetch, gather; free and the same again;
    then a gather with nothing on its way, each against what it must send and hold. Judged by
    behaviour, not by attribute names: the handle's name is the learner's."""
    from ...runtime.ledger import CommLedger
    world = dist.get_world_size()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = nn.Linear(4, 7)                           # 35 elements: divisible by none of 2, 3, 4
    want = flatten_and_pad([p.detach().clone() for p in module.parameters()], world)
    unit = cls(module)
    full = getattr(unit, "full", None)
    works = []
    with CommLedger() as ledger, _late_all_gathers(works):
        def gathers() -> int:
            return ledger.counts().get("all_gather", 0)

        def holds(what: str) -> str:
            if unit.full is not full:
                return (f"after {what}, self.full is a new tensor: the parameters are views of the one "
                        "__init__ made, so fill that same tensor (alloc_storage, then the all-gather into it)")
            if torch.isnan(unit.full).any():
                return (f"{what} returned before the prefetch's data arrived (self.full still reads NaN "
                        "here, where the data lands only when waited for): wait on the handle first")
            if not torch.equal(unit.full.detach(), want):
                return f"after {what}, self.full differs from every rank's shards, in order"
            return ""

        for rnd in (1, 2):
            unit.prefetch()
            if gathers() != rnd:
                if rnd == 2:
                    return ("after a gather() that used a prefetch, and free(), prefetch() started nothing: "
                            "gather() must forget the handle it waited for, or this unit never gathers again")
                return (f"prefetch() started {gathers()} all-gathers, expected 1: this unit's, into self.full"
                        if gathers() else "prefetch() started no all-gather: start the unit's, into self.full")
            if not works or works[-1].landed:
                return ("prefetch() waited for its all-gather: it must return at once (async_op=True), keeping "
                        "the handle, so that the all-gather travels while another unit computes")
            unit.prefetch()
            if gathers() != rnd:
                return ("a second prefetch() of a unit already on its way started another all-gather: do "
                        "nothing while its all-gather is on its way (or the unit is gathered)")
            unit.gather()
            if gathers() != rnd:
                return ("gather() started an all-gather of its own while a prefetch was on its way: wait on "
                        "that one's handle instead")
            problem = holds("prefetch() and gather()")
            if problem:
                return problem
            unit.free()
            if _gathered(unit):
                return "free() after a prefetched gather left self.full holding memory"
        unit.gather()
        if gathers() != 3:
            return ("gather() with no prefetch on its way must gather as MyFlatUnit's does (one "
                    f"all-gather); it made {gathers() - 2}")
        problem = holds("a gather() with nothing on its way")
        unit.prefetch()
        if not problem and gathers() != 3:
            return ("prefetch() on a unit already gathered started another all-gather: do nothing while "
                    "self.full holds its memory")
        unit.free()
    return problem


def prefetch_on_rank(cls, steps: int = 2) -> list:
    """Rank side of :func:`check_prefetch`: ``[(first problem or '', what was seen)]``. The unit
    alone first (:func:`_one_unit_problem`), then the course GPT made of ``cls`` units with
    :class:`~course_utils.harness.units.UnitModel`'s prefetching, ``steps`` SGD steps beside one
    process, its all-gathers' data landing only when waited for."""
    from ...harness.experiments import global_loss
    from ...harness.model import SyntheticData, build_model
    from ...harness.units import UnitModel
    from ...labs.frames import raised_at
    from ...runtime.ledger import CommLedger
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = {"losses": [], "ref_losses": [], "most_gathered": 0, "early": 0}
    phase = "the unit alone"
    try:
        problem = _one_unit_problem(cls)
    except _Mistake as exc:
        problem = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        message = str(exc)
        problem = (("an all-gather wrote into self.full while it had no memory: give it its memory back "
                    "(alloc_storage) before the all-gather" + raised_at(exc))
                   if "storage of size 0" in message or "not allocated" in message else _raised(phase, exc))
    anyone = torch.tensor([float(bool(problem))])
    dist.all_reduce(anyone)
    if anyone.item() > 0:               # every rank stops here, together
        return [(problem, seen)]
    try:
        phase = "UnitModel(model, cls, prefetch=True)"
        ref, model = build_model(seed=0), UnitModel(build_model(seed=0), cls, prefetch=True)
        blocks = model.units[1:]
        def computing(i):
            seen["most_gathered"] = max(seen["most_gathered"], sum(_gathered(u) for u in model.units))
            if i + 1 < len(blocks) and _gathered(blocks[i + 1]):
                seen["early"] += 1
        for i, unit in enumerate(blocks):
            unit.module.register_forward_pre_hook(lambda m, args, i=i: computing(i))
        opt, ref_opt = (torch.optim.SGD(ps, lr=BUILD_LR) for ps in (model.shard_parameters(), ref.parameters()))
        data = SyntheticData(global_batch=BUILD_BATCH, seed=0)
        for step in range(steps):
            ref_loss = ref(*data.batch(step))
            ref_loss.backward()
            works = []
            with CommLedger() as ledger, _late_all_gathers(works):
                phase = "forward"
                loss = model(*data.shard(step, rank, world))
                phase = "backward"
                loss.backward()
            phase = "optimizer.step()"
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()
            seen["losses"].append(global_loss(loss))
            seen["ref_losses"].append(ref_loss.item())
            seen["all_gathers"] = ledger.counts().get("all_gather", 0)
            if not problem and seen["all_gathers"] != 2 * len(blocks) + 1:
                problem = (f"step {step + 1}: {seen['all_gathers']} all-gathers, expected 2L + 1 = "
                           f"{2 * len(blocks) + 1} as without prefetch: prefetch moves the all-gathers earlier, "
                           "it adds none")
            if not problem and any(_gathered(u) for u in model.units):
                problem = f"after step {step + 1}'s backward a unit is still gathered: free it as before"
        seen["units"] = len(model.units)
    except _Mistake as exc:
        return [(problem or str(exc), seen)]
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        return [(problem or _raised(phase, exc) if phase in ("forward", "backward")
                 else problem or f"{phase} raised {type(exc).__name__}: {exc}{raised_at(exc)}", seen)]
    worst = max(abs(a - b) for a, b in zip(seen["losses"], seen["ref_losses"]))
    if not problem and not worst <= 1e-5:                 # NaN too
        problem = f"the losses differ from one process's by up to {worst:.3g}"
    if not problem and seen["early"] < steps * (len(blocks) - 1):
        problem = ("a block computed while the next block's self.full held no memory: prefetch() must "
                   "start the all-gather into that unit's own self.full (is the handle kept per unit, on self?)")
    seen["loss_diff"] = worst
    return [(problem, seen)]


def _prefetch_right(values) -> str:
    seen = values[0][0][1]
    return (f"prefetch() returns at once, gather() waits for it: {seen['all_gathers']} all-gathers per step, "
            f"as without prefetch; the next block's on its way while each block computes, at most "
            f"{seen['most_gathered']} of {seen['units']} units gathered; losses = one process "
            f"(|diff| {bound(seen['loss_diff'], 1e-5)})")


def check_prefetch(cls, *, timeout_s: float = 30, world_sizes=(2, 3, 4)) -> Verdict:
    """Exercise 06.2 (optional): ``cls``, a subclass of your ``MyFlatUnit``, adds ``prefetch()``."""
    from ...labs.grading import PASSED
    base = PASSED.get("zero3")
    if isinstance(cls, type) and not (base is not None and issubclass(cls, base)):
        print("(your MyFlatUnit has not passed check_zero3 in this kernel: 06.2 builds on it, so pass 06.1 first)")
    return grade_build("prefetch", "MyPrefetchUnit", cls, prefetch_on_rank, right=_prefetch_right,
                       timeout_s=timeout_s, world_sizes=world_sizes)
