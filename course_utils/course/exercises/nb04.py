"""Exercises of ``notebooks/04_zero1.ipynb``; :func:`zero_on_rank` also grades notebook 05's ZeRO-2."""
from __future__ import annotations

import copy
import dataclasses
import gc

import torch
import torch.distributed as dist

from ...labs.grading import (GROUP_GONE, Verdict, carried_over, grade_build)
from ...impl.common import make_buckets, storage_bytes
from ...theory.layout import padded_numel, shard_bounds
from ...runtime.fmt import bound

__all__ = ["check_zero1", "SpyAdamW", "zero_on_rank",
           "params_right", "check_mixed", "mixed_on_rank"]


# ------------------------------------------------------------ exercise 04.1: build ZeRO-1
#: AdamW of the build graders (ZeRO-1 and ZeRO-2); weight decay on the matrices (group 0:
#: 126,650 elements); group 1: a frozen norm weight alone (50); group 2: the other vectors
#: (2,550). A small lr and eps 1e-6 keep AdamW's first steps
#: (about lr·sign(g), however small g) from amplifying the rounding of near-zero gradients
#: summed in another order: the parameters then agree with one process to 1e-6.
LR, BETAS, EPS, DECAY = 1e-4, (0.9, 0.95), 1e-6, (0.1, 0.05, 0.0)


class SpyAdamW(torch.optim.AdamW):
    """torch's AdamW that records, at every ``step()``, its gradients, their bytes, each
    parameter's ``lr`` and ``weight_decay``, and its state's bytes afterwards."""
    made: list = []                     # the instances built in this process, in order

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[dict] = []
        SpyAdamW.made.append(self)

    @torch.no_grad()
    def step(self, closure=None):
        params = [(p, g) for g in self.param_groups for p in g["params"]]
        grads = [p.grad for p, _ in params]
        seen = {"grads": [None if t is None else t.clone() for t in grads],
                "grad_bytes": storage_bytes(grads, set()),
                "hyper": [(g["lr"], g["weight_decay"]) for _, g in params]}
        out = super().step(closure)
        seen["state_bytes"] = _state_of(self)
        self.seen.append(seen)
        return out


def _state_of(opt: torch.optim.Optimizer) -> int:
    return storage_bytes([v for s in opt.state.values() for v in s.values()
                          if isinstance(v, torch.Tensor)], set())


def _groups(model, one_group: bool = False) -> list[dict]:
    """Matrices; the frozen norm's weight alone (a group with nothing to shard or step, as a
    fine-tuning script's frozen layers make); the other vectors, the frozen norm's bias among
    them (the optimizer must leave both alone). ``one_group``: every parameter in one group, the
    frozen ones included (the first stage of the build: ZeRO alone, without torch's groups)."""
    named = list(model.named_parameters())
    if one_group:
        return [{"params": [p for _, p in named], "weight_decay": DECAY[0]}]
    alone = model.blocks[0].norm1.weight
    return [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": DECAY[0]},
            {"params": [alone], "weight_decay": DECAY[1]},
            {"params": [p for _, p in named if p.dim() < 2 and p is not alone], "weight_decay": DECAY[2]}]


@dataclasses.dataclass
class _Flat:
    """A learner's flat buffer, found from its shard: names, offsets, Ψ_b, P_b, group."""
    names: list
    offsets: list
    numel: int
    padded: int
    group: int

    def full(self, tensors: dict) -> torch.Tensor:
        flat = torch.zeros(self.padded)
        for name, off in zip(self.names, self.offsets):
            t = tensors[name]
            if t is not None:
                flat[off:off + t.numel()] = t.detach().reshape(-1)
        return flat


_N_TIMES = "holds {}× the state: the inner optimizer must see only this rank's shard"


def _layout(model, groups: list, n: int, rank: int, expected_buckets: int, how: str) -> tuple[str, list]:
    """('', flat buffers in inner-optimizer order) or (what is wrong, [])."""
    if not SpyAdamW.made:
        return ("__init__ did not build optimizer_class: build it once, over this rank's shards, "
                "one inner group per parameter group"), []
    if len(SpyAdamW.made) > 1:
        return f"optimizer_class was built {len(SpyAdamW.made)} times: build it once, over every shard", []
    named = dict(model.named_parameters())
    trained = {name: p for name, p in named.items() if p.requires_grad}
    shards = [q for g in SpyAdamW.made[0].param_groups for q in g["params"]]
    if any(q is p for q in shards for p in named.values()) or \
            sum(q.numel() for q in shards) >= sum(p.numel() for p in trained.values()) > 0:
        return f"{_N_TIMES.format(n)} (it was given the full parameters)", []
    group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
    by_storage: dict = {}
    for name, p in named.items():
        by_storage.setdefault(p.untyped_storage().data_ptr(), []).append((p.storage_offset(), name))
    flats, covered = [], set()
    for q in shards:
        members = sorted(by_storage.get(q.untyped_storage().data_ptr(), []))
        if not members:
            return ("the inner optimizer's parameters are not views of a flat buffer the model's "
                    "parameters are views of: make each parameter a view of its flat buffer "
                    "(p.data = flat[off:off + p.numel()].view_as(p)) and the shard "
                    "nn.Parameter(flat[lo:hi])"), []
        frozen = [name for _, name in members if not named[name].requires_grad]
        if frozen:
            return f"frozen {frozen[0]} is in a flat buffer: flatten only the trainable parameters", []
        in_groups = sorted({group_of[id(named[name])] for _, name in members})
        if len(in_groups) > 1:
            return (f"one flat buffer mixes parameter groups {in_groups[0]} and {in_groups[1]}: one "
                    "flat buffer per group, so each group keeps its own hyperparameters"), []
        base = members[0][0]
        numel = sum(named[name].numel() for _, name in members)
        padded = padded_numel(numel, n)
        if q.untyped_storage().nbytes() // q.element_size() - base < padded:
            return (f"a flat buffer of Ψ = {numel:,} elements is not padded to a multiple of {n} "
                    f"({padded:,}): pad it with zeros, so that every rank's shard has P/N = "
                    f"{padded // n:,} elements"), []
        if q.numel() == padded and n > 1:
            return f"{_N_TIMES.format(n)} (it was given a whole flat buffer)", []
        if q.numel() != padded // n:
            return (f"this rank's shard has {q.numel():,} elements, expected P/N = {padded // n:,} "
                    f"(Ψ = {numel:,} padded to P = {padded:,})"), []
        start = q.storage_offset() - base
        if start != rank * padded // n:
            return (f"rank {rank}'s shard starts at element {start:,} of its flat buffer, expected "
                    f"r·P/N = {rank * padded // n:,}: rank r owns [r·P/N, (r+1)·P/N)"), []
        flats.append(_Flat([name for _, name in members], [off - base for off, _ in members],
                           numel, padded, in_groups[0]))
        covered.update(name for _, name in members)
    missing = [name for name in trained if name not in covered]
    if missing:
        after = [i for i, g in enumerate(groups[:group_of[id(named[missing[0]])]])
                 if not any(p.requires_grad for p in g["params"])]
        return (f"{missing[0]} is in no flat buffer: flatten every trainable parameter of every group"
                + (f" (it is in a group after group {after[-1]}, which has nothing to train: skip such a group "
                   "and go on to the next, continue, not break)" if after else "")), []
    if len(flats) != expected_buckets:
        return f"{len(flats)} flat buffers (shards), expected {expected_buckets}: {how}", []
    return "", flats


def _hyper_problem(flats: list, got: list, lrs: list, when: str) -> str:
    for f, (lr, decay) in zip(flats, got):
        if decay != DECAY[f.group]:
            return (f"{when}the inner optimizer has weight_decay={decay:g} for group {f.group}'s shard, "
                    f"your group {f.group} says {DECAY[f.group]:g}: one inner group per parameter "
                    "group, with that group's hyperparameters")
        if lr != lrs[f.group]:
            return (f"{when}the inner optimizer has lr={lr:g} for group {f.group}'s shard, your "
                    f"param_groups[{f.group}]['lr'] is {lrs[f.group]:g} (changed after step 1, as an LR "
                    "scheduler does): copy each group's hyperparameters into its inner group in step()")
    return ""


def _grad_problem(flats: list, grads: list, ref: dict, own: dict, n: int, rank: int,
                  second: dict | None = None) -> str:
    """'' or what is wrong with the first shard gradient; ``second``: one process's gradient of
    the step's second micro-batches alone (ZeRO-2 accumulates two backwards)."""
    for f, g in zip(flats, grads):
        size = f.padded // n
        want_all = f.full(ref)
        want = want_all[rank * size:(rank + 1) * size]
        if g is None:
            return ("a shard's .grad is None at the inner optimizer's step: give each shard the "
                    "averaged gradient of its slice")
        if g.shape != want.shape:
            return f"a shard's .grad has shape {tuple(g.shape)}, expected ({size},)"
        if torch.allclose(g, want, rtol=1e-4, atol=1e-6):
            continue
        if torch.allclose(g, n * want, rtol=1e-4, atol=1e-6):
            return f"the shard gradient is the SUM over the {n} ranks: divide by the world size"
        if second is not None:
            alone = f.full(second)[rank * size:(rank + 1) * size]
            if any(torch.allclose(g, m, rtol=1e-4, atol=1e-7) for m in (alone, n * alone)):
                return ("the shard gradient is the step's second backward's alone: the second backward "
                        "replaced the shard's gradient instead of adding to it")
            if any(torch.allclose(g, m, rtol=1e-4, atol=1e-7) for m in (want - alone, n * (want - alone))):
                return ("the shard gradient is the step's first backward's alone: the second backward's "
                        "reduce-scatter was not added by the time backward returned (wait for every "
                        "reduce-scatter, the last one too, and add it in _finish)")
        own_all = f.full(own)
        for k in [rank] + [k for k in range(n) if k != rank]:
            mine = own_all[k * size:(k + 1) * size]
            if any(torch.allclose(g, m, rtol=1e-5, atol=1e-7) for m in (mine / n, mine)):
                return ("the shard gradient is this rank's own: reduce-scatter (SUM) the flat gradient "
                        "into the own slice first" if k == rank else
                        f"the shard gradient is this rank's own, not reduced, chunk {k} of the flat "
                        "gradient: read the reduce-scatter's output where it wrote it (the own slice)")
        if n > 1 and torch.allclose(g, want / n, rtol=1e-4, atol=1e-7):
            return (f"the shard gradient is the average divided by {n} again: divide the sum by the "
                    "world size once")
        for k in range(n):
            if torch.allclose(g, want_all[k * size:(k + 1) * size], rtol=1e-4, atol=1e-6):
                return (f"the shard gradient is rank {k}'s slice: rank {rank} owns "
                        f"[r·P/N, (r+1)·P/N) of the padded flat gradient")
        return (f"the gradient of group {f.group}'s shard differs from the global batch's by up to "
                f"{(g - want).abs().max().item():.3g}")
    return ""


def _param_problem(flats: list, model, ref, before: dict, n: int, rank: int, step: int) -> tuple[str, float]:
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    worst = 0.0
    for name, q in want.items():
        p = got[name]
        if not q.requires_grad:
            if not torch.equal(p, q):
                return f"frozen {name} changed: leave frozen parameters alone", worst
            continue
        if torch.allclose(p, q, rtol=1e-4, atol=1e-6):
            worst = max(worst, (p - q).abs().max().item())
            continue
        for f in (f for f in flats if name in f.names):
            size = f.padded // n
            mine = torch.zeros(f.padded, dtype=torch.bool)
            mine[rank * size:(rank + 1) * size] = True
            now = f.full(got)
            if torch.allclose(now[mine], f.full(want)[mine], rtol=1e-4, atol=1e-6) and \
                    torch.equal(now[~mine], f.full(before)[~mine]):
                return ("only this rank's slice of the parameters changed: the other ranks' slices "
                        "were not all-gathered into the flat parameter buffer"), worst
        return (f"after step {step + 1}, {name} differs from one process by up to "
                f"{(p - q).abs().max().item():.3g}"), worst
    return "", worst


def _comm_problem(counts: dict, buckets: int, backwards: int = 1) -> str:
    rs, ag, ar = (counts.get(op, 0) for op in ("reduce_scatter", "all_gather", "all_reduce"))
    if ar:
        return (f"{ar} all-reduces per step: the same numbers, but an all-reduce sends twice the "
                "bytes of a reduce-scatter; reduce-scatter (SUM) each flat gradient into the own slice")
    if rs != buckets * backwards:
        return (f"{rs} reduce-scatters per step, expected {buckets * backwards} (one per flat buffer"
                + (f" in each of the step's {backwards} backwards)" if backwards > 1 else ")"))
    if ag != buckets:
        return (f"{ag} all-gathers per step, expected {buckets} (one per flat buffer): all-gather "
                "the updated slices into the flat parameter buffer")
    return ""


def _backward_problem(bw_counts: dict, model, buckets: int, second: bool = False) -> str:
    rs = bw_counts.get("reduce_scatter", 0)
    if bw_counts.get("all_reduce", 0):
        return (f"{bw_counts['all_reduce']} all-reduces during backward: the same numbers, but an "
                "all-reduce sends twice the bytes of a reduce-scatter; reduce-scatter (SUM) each bucket "
                "into the own slice")
    if rs == 0 and second:
        return ("the step's second backward (gradient accumulation) sent nothing: the hooks' state "
                "(self.next, self.ready) was not reset at the end of _finish, or no _finish was queued "
                "for it; each backward sends its buckets and adds into the shard gradients")
    if rs == 0:
        return ("no reduce-scatter while backward ran: reduce-scatter from the hooks, during "
                "backward, not in step()")
    if rs != buckets:
        return (f"{rs} reduce-scatters during backward, expected {buckets} (one per bucket): launch "
                "each bucket, in order, as soon as its last gradient is in")
    held = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is not None]
    if held:
        return (f"full gradients not freed ({held[0]}.grad is still there when backward returns): "
                "set p.grad = None once its bucket is in the message")
    return ""


def _second_only(ref, data, step: int, n: int) -> dict:
    """One process's gradient of step ``step``'s second micro-batches alone (every rank's rows
    from the middle of its shard on, each micro-batch's loss weighted by its share of the rows)."""
    model = copy.deepcopy(ref)
    model.zero_grad(set_to_none=True)
    rows = [data.shard(step, r, n) for r in range(n)]
    xs = torch.cat([x[x.shape[0] // 2:] for x, _ in rows])
    ys = torch.cat([y[y.shape[0] // 2:] for _, y in rows])
    (model(xs, ys) * (xs.shape[0] / sum(x.shape[0] for x, _ in rows))).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _order_problem(records, calls: list) -> str:
    """'' when every rank issued the same collectives (op, message size), in the same order, at
    the same points of this backward (gradients in: ``calls``, a :class:`CollectiveWatch`'s);
    else which rank differs from rank 0, and where. Every rank calls it (it is a collective)."""
    mine = [(r.op, r.message_bytes) for r in records]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, [c["at"] for c in calls]))
    first, first_at = everyone[0]
    for rank, (theirs, at) in enumerate(everyone[1:], 1):
        if theirs != first:
            k = next((i for i, (a, b) in enumerate(zip(first, theirs)) if a != b), min(len(theirs), len(first)))
            said = lambda seq: (f"{seq[k][0].replace('_', '-')} of {seq[k][1]:,} B" if k < len(seq)  # noqa: E731
                                else "nothing")
            return (f"rank {rank}'s collectives in backward differ from rank 0's, from the {k + 1}th on "
                    f"(rank 0: {said(first)}, rank {rank}: {said(theirs)}): every rank must launch "
                    "the same buckets in the same order")
        if at != first_at:
            k = next(i for i, (a, b) in enumerate(zip(first_at, at)) if a != b)
            return (f"rank {rank} launched bucket {k} after {at[k]} gradients had arrived, rank 0 after "
                    f"{first_at[k]}: the same buckets at other moments, so one of them sent gradients that "
                    "were not in yet; launch bucket self.next once all ITS gradients are in (the hooks "
                    "must wait for the bucket that _launch sends)")
    return ""


def _zero_run(cls, bucket_bytes, stage: int, steps: int, one_group: bool = False) -> tuple[str, dict]:
    from ...harness.model import SyntheticData
    from ...theory.zero import expected_state_bytes
    from ...labs.frames import raised_at
    from ...labs.grading import error_hint
    from ...runtime import ledger as ledgers
    from ...runtime.ledger import CommLedger
    from .nb02 import CollectiveWatch, _frozen_model
    rank, n = dist.get_rank(), dist.get_world_size()
    data = SyntheticData(global_batch=12, seed=0)
    ref, model = _frozen_model(seed=100), _frozen_model(seed=100)
    ref_opt = torch.optim.AdamW(_groups(ref, one_group), lr=LR, betas=BETAS, eps=EPS)
    groups = _groups(model, one_group)
    options = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
    buckets = sum(len(make_buckets([p for p in g["params"] if p.requires_grad], bucket_bytes))
                  for g in groups)
    how = ("one per trainable parameter with bucket_bytes=0" if bucket_bytes == 0 else
           "one per parameter group (each group fits in one bucket)")
    seen = {"bucket_bytes": bucket_bytes, "worst": 0.0, "rs_in_backward": None}
    SpyAdamW.made.clear()
    problem, flats, opt = "", [], None
    try:
        opt = cls(groups, SpyAdamW, **options, lr=LR, betas=BETAS, eps=EPS)
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        args = "".join(f", {k}={v}" for k, v in options.items())
        problem = (f"{cls.__name__}(groups, optimizer_class{args}, lr=...) raised {type(exc).__name__}: "
                   f"{exc}{error_hint(str(exc))}{raised_at(exc)}")
    if not problem and [[id(p) for p in g["params"]] for g in getattr(opt, "param_groups", [])] != \
            [[id(p) for p in g["params"]] for g in groups]:
        problem = ("self.param_groups are not the groups given: call super().__init__(params, "
                   "defaults) first")
    if not problem:
        problem, flats = _layout(model, groups, n, rank, buckets, how)
    problem = problem or _hyper_problem(flats, [(g["lr"], g["weight_decay"])
                                                for g in SpyAdamW.made[0].param_groups
                                                for _ in g["params"]], [LR] * len(groups), "after __init__, ")
    anyone = torch.tensor([float(bool(problem))])
    dist.all_reduce(anyone)
    if anyone.item() > 0:               # every rank stops here, none waits in a collective
        return problem, seen
    inner = SpyAdamW.made[0]
    micro = 2 if stage == 2 else 1      # ZeRO-2 accumulates: two backwards before each step
    watch = CollectiveWatch(names=None)             # when each collective left, in gradients arrived
    watch.spy_on([p for p in model.parameters() if p.requires_grad])
    for step in range(steps):           # every rank runs every step
        before_step = problem
        x, y = data.shard(step, rank, n)
        local = copy.deepcopy(ref)                  # this rank's own gradients, for diagnosis
        local(x, y).backward()
        cut = x.shape[0] // 2 if micro == 2 else x.shape[0]
        second = _second_only(ref, data, step, n) if micro == 2 else None
        in_backward = {}
        for i, (xs, ys) in enumerate(((x[:cut], y[:cut]), (x[cut:], y[cut:]))[:micro]):
            watch.reset()
            with CommLedger() as bw:        # each micro-batch's loss weighted by its share of the rows
                ledgers.push_transport(watch)
                try:
                    (model(xs, ys) * (xs.shape[0] / x.shape[0])).backward()
                finally:
                    ledgers.pop_transport(watch)
            if stage == 2:
                seen["rs_in_backward"] = bw.counts().get("reduce_scatter", 0)
                order = _order_problem(bw.records, watch.calls)   # a collective: every rank, every time
                problem = problem or order or _backward_problem(bw.counts(), model, buckets, second=i > 0)
            in_backward = {op: in_backward.get(op, 0) + k for op, k in bw.counts().items()}
        ref(*data.batch(step)).backward()
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        try:
            with CommLedger() as st:
                opt.step()
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            seen["left"] = True         # the other ranks may wait in step()'s collectives
            return problem or f"step() raised {type(exc).__name__}: {exc}{error_hint(str(exc))}{raised_at(exc)}", seen
        ref_opt.step()
        counts = {op: in_backward.get(op, 0) + st.counts().get(op, 0)
                  for op in ("reduce_scatter", "all_gather", "all_reduce")}
        seen.update(counts=counts, buckets=len(flats), full_state=_state_of(ref_opt),
                    padded=sum(f.padded for f in flats))
        if len(SpyAdamW.made) > 1:          # the states must live from step to step
            problem = problem or (f"the inner optimizer was built {len(SpyAdamW.made)} times: build it once, in "
                                  "__init__; a new one starts from m = v = 0 and step 1 again, so every step "
                                  "is a first step")
        elif len(inner.seen) != step + 1:
            calls = len(inner.seen) - step
            problem = problem or ("step() did not call the inner optimizer's step()" if calls <= 0 else
                                  f"step() called the inner optimizer's step() {calls} times, expected once")
        else:
            record = inner.seen[-1]
            seen.update(state=record["state_bytes"], grad_bytes=record["grad_bytes"])
            want_state = expected_state_bytes([f.numel for f in flats], n, stage)
            own = {name: p.grad for name, p in local.named_parameters()}
            problem = (problem or _grad_problem(flats, record["grads"],
                                                {name: p.grad for name, p in ref.named_parameters()},
                                                own, n, rank, second)
                       or _state_problem(record["state_bytes"], want_state["optimizer"], n)
                       or (f"the shard gradients take {record['grad_bytes']:,} B, expected 4·P/N = "
                           f"{want_state['grads']:,} B: keep one P/N-element gradient buffer per "
                           "bucket, not a full-size one"
                           if stage == 2 and record["grad_bytes"] > want_state["grads"] else "")
                       or _hyper_problem(flats, record["hyper"],
                                         [g["lr"] for g in ref_opt.param_groups], f"step {step + 1}: "))
        found, worst = _param_problem(flats, model, ref, before, n, rank, step)
        seen["worst"] = max(seen["worst"], worst)
        problem = problem or found or _comm_problem(counts, len(flats), micro)
        if step and problem and not before_step:
            problem = carried_over(problem, step)
        opt.zero_grad()
        ref_opt.zero_grad()
        for g in opt.param_groups + ref_opt.param_groups:      # as an LR scheduler would
            g["lr"] = LR / 2
    return problem, seen


def _state_problem(got: int, want: int, n: int) -> str:
    if got == want:
        return ""
    if n > 1 and got >= 0.9 * n * want:
        return f"{_N_TIMES.format(n)} ({got:,} B, expected 8·P/N + 4 per shard = {want:,} B)"
    return (f"the inner optimizer holds {got:,} B of state after step(), expected 8·P/N + 4 per "
            f"shard = {want:,} B")


def zero_on_rank(cls, bucket_sizes: tuple, stage: int, steps: int = 2, one_group: bool = False) -> list:
    """Rank side of ZeRO-1 (``bucket_sizes=(None,)``) and ZeRO-2: [(problem or '', seen)];
    ``one_group``: the parameters in one group, not three. ZeRO-1's exercise (stage 1, not
    ``one_group``): :func:`_zero1_either`."""
    if stage == 1 and not one_group:
        return [_zero1_either(cls, steps)]
    return [_zero_run(cls, b, stage, steps, one_group) for b in bucket_sizes]


def _zero1_either(cls, steps: int) -> tuple[str, dict]:
    """Exercise 04.1: right on one group; given two, either refusing them with an exception at
    construction (a class that handles one group fails loudly, never silently: parameter groups are
    the build's optional part) or taking them, and then right on three (one of them all frozen)."""
    def ranks_with(flag) -> int:         # every rank takes the same branch: none waits in a collective alone
        count = torch.tensor([float(bool(flag))])
        dist.all_reduce(count)
        return int(count.item())

    def group_gone() -> bool:           # the learner's objects are gone: did a __del__ take the group along?
        gc.collect()
        return not dist.is_initialized()

    problem, seen = _zero_run(cls, None, 1, steps, one_group=True)
    if seen.get("left"):                # this rank left mid-step; the others wait in its collective
        return problem, seen
    if group_gone():
        return problem or GROUP_GONE, seen
    if ranks_with(problem):
        return problem, seen
    refusal = _refuses_groups(cls)
    if group_gone():
        return GROUP_GONE, seen
    refused = ranks_with(refusal)
    if refused == dist.get_world_size():
        seen["groups"] = refusal
        return "", seen
    if refused:
        return (f"built over three parameter groups, __init__ raised {refusal} on this rank, not on every rank: "
                "every rank must build the same" if refusal else ""), seen
    problem, seen = _zero_run(cls, None, 1, steps)
    if problem:
        problem = (f"right on one parameter group; with three (one of them all frozen): {problem} (or, to "
                   "leave groups for later, raise an error in __init__ when given more than one)")
    return problem, seen


def _refuses_groups(cls) -> str:
    """What ``cls`` raised when built over two plain groups (matrices, vectors: nothing a groups-handling
    class could trip on); '' if it took them, and must then train the three groups right."""
    from .nb02 import _frozen_model
    named = list(_frozen_model(seed=100).named_parameters())
    two = [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": DECAY[0]},
           {"params": [p for _, p in named if p.dim() < 2], "weight_decay": DECAY[2]}]
    try:
        cls(two, SpyAdamW, lr=LR, betas=BETAS, eps=EPS)
    except Exception as exc:  # noqa: BLE001 - a refusal is what the spec allows
        return f"{type(exc).__name__}: {exc}"
    return ""


def params_right(values) -> str:
    worst = max(seen["worst"] for per in values for _, seen in per)
    return f"parameters = one process after 2 steps (|diff| {bound(worst, 1e-5)})"


def _zero1_right(values) -> str:
    seen = values[0][0][1]
    groups = ("" if "groups" not in seen else
              f"; several parameter groups refused at construction ({seen['groups'][:80]}), as allowed: "
              "handling them is the optional part")
    return (f"AdamW state 1/N (rank 0: 8·P/N + {4 * seen['buckets']} = {seen['state']:,} B, one process "
            f"{seen['full_state']:,} B), per step {seen['counts']['reduce_scatter']} reduce-scatters + "
            f"{seen['counts']['all_gather']} all-gathers, {params_right(values)}{groups}")


#: the verdict's name for the first stage: passing it is not passing ``zero1`` (``yours`` wants the whole build)
ONE_GROUP = "zero1, one group"


def check_zero1(cls, *, one_group: bool = False, timeout_s: float = 30, world_sizes=(2, 3, 4)) -> Verdict:
    """Exercise 04.1: ``cls(params, optimizer_class, **defaults)`` is ZeRO-1, checked on 2, 3
    and 4 ranks (course GPT, AdamW, two steps, lr halved between) against one process: inner
    optimizer over shards, gradients, hyperparameters, collectives, parameters. The exercise: every
    parameter in one group (frozen ones included); then several groups, which the class must either
    refuse with an exception at construction or handle, three of them (one all frozen) right.
    ``one_group=True``: the one-group run alone (its own verdict, not the exercise's)."""
    return grade_build(ONE_GROUP if one_group else "zero1", "MyZero1", cls, zero_on_rank, (None,), 1, 2, one_group,
                       right=_zero1_right, timeout_s=timeout_s, world_sizes=world_sizes)


# --------------------------------------------- exercise 04.2 (optional): ZeRO-1 in mixed precision
#: the mixed-precision grader's learning rate (AdamW's first steps move each master element by about lr)
MIXED_LR = 1e-3


def _mixed_run(cls, steps: int) -> tuple[str, dict]:
    from ...harness.model import SyntheticData
    from ...impl.zero import MixedZero1
    from .nb02 import _frozen_model
    rank, n = dist.get_rank(), dist.get_world_size()
    model, ref = _frozen_model(seed=100), _frozen_model(seed=100)
    groups, seen = _groups(model), {}
    trained = [g for g in groups if any(p.requires_grad for p in g["params"])]   # the all-frozen one has no shard
    fp32 = [_flat_of(p.detach() for p in g["params"] if p.requires_grad) for g in trained]
    bounds = [shard_bounds(f.numel(), n, rank) for f in fp32]
    SpyAdamW.made.clear()
    try:
        opt = cls(groups, SpyAdamW, lr=MIXED_LR, betas=BETAS, eps=EPS)
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        return f"{cls.__name__}(groups, optimizer_class, lr=...) raised {type(exc).__name__}: {exc}", seen
    ref_opt = MixedZero1(_groups(ref), SpyAdamW, lr=MIXED_LR, betas=BETAS, eps=EPS)   # its bytes
    problem = _mixed_layout_problem(model, fp32, bounds)
    if _anyone(problem):                # every rank stops here, none waits in a collective
        return problem, seen
    inner = SpyAdamW.made[0]
    masters = [q for g in inner.param_groups for q in g["params"]]
    data = SyntheticData(global_batch=12, seed=0)
    for step in range(steps):
        x, y = data.shard(step, rank, n)
        model(x, y).backward()
        avg = [_flat_of(p.grad for p in g["params"] if p.requires_grad).float() for g in trained]
        for a in avg:                   # the ranks' average gradient, in fp32
            dist.all_reduce(a)
            a /= n
        try:
            opt.step()
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            return f"step {step + 1}: step() raised {type(exc).__name__}: {exc}", seen
        opt.zero_grad()
        problem = _mixed_step_problem(inner, step, avg, bounds, trained, masters, n)
        mine = torch.tensor([sum(float(f.double().sum()) for f in
                                 (_flat_of(p.detach() for p in g["params"]) for g in groups))], dtype=torch.float64)
        spread = [torch.zeros_like(mine) for _ in range(n)]
        dist.all_gather(spread, mine)
        if _anyone(problem):
            return problem, seen
        if len({t.item() for t in spread}) > 1:
            return (f"step {step + 1}: the ranks' parameters differ: all-gather every rank's updated slice "
                    "into the bf16 buffer"), seen
    ref(*data.shard(0, rank, n)).backward()
    ref_opt.step()
    from ...harness.experiments import state_bytes
    seen.update(optimizer=state_bytes(model, opt)["optimizer"], want=state_bytes(ref, ref_opt)["optimizer"],
                params=state_bytes(model, opt)["params"], shard=sum(q.numel() for q in masters))
    if seen["optimizer"] != seen["want"]:
        return (f"the optimizer holds {seen['optimizer']:,} B on rank {rank}, expected 12·P/N + 4 per "
                f"shard = {seen['want']:,} B (fp32 master 4 + m and v 8 bytes per element)"), seen
    return "", seen


def _anyone(problem: str) -> bool:
    """Whether any rank found a problem (a collective: every rank calls it)."""
    flag = torch.tensor([float(bool(problem))])
    dist.all_reduce(flag)
    return flag.item() > 0


def _mixed_layout_problem(model, fp32: list, bounds: list) -> str:
    if len(SpyAdamW.made) != 2:
        return "__init__ did not build optimizer_class once: build it once, over the masters"
    named = dict(model.named_parameters())
    wrong = [(k, p.dtype) for k, p in named.items() if p.requires_grad and p.dtype != torch.bfloat16]
    if wrong:
        return (f"after __init__, {wrong[0][0]} is {wrong[0][1]}: the trainable parameters must be views "
                "of a bf16 flat buffer (2 bytes each)")
    if any(not p.requires_grad and p.dtype != torch.float32 for p in named.values()):
        return "a frozen parameter changed dtype: leave frozen parameters alone"
    masters = [q for g in SpyAdamW.made[0].param_groups for q in g["params"]]
    if [q.dtype for q in masters] != [torch.float32] * len(fp32) or \
            [q.numel() for q in masters] != [hi - lo for lo, hi in bounds]:
        return (f"the inner optimizer steps {[(str(q.dtype)[6:], q.numel()) for q in masters]} (dtype, "
                f"elements), expected one fp32 master per group of this rank's slice: "
                f"{[('float32', hi - lo) for lo, hi in bounds]}")
    want = [_padded(f, lo, hi) for f, (lo, hi) in zip(fp32, bounds)]
    if all(torch.equal(q.detach(), w) for q, w in zip(masters, want)):
        return ""
    if all(torch.equal(q.detach(), w.bfloat16().float()) for q, w in zip(masters, want)):
        return "the masters hold the weights rounded to bf16: copy this rank's slice in fp32 before converting the buffer"
    return ("the masters are not this rank's slice of the weights (in fp32, in the group's parameter order): "
            "rank r owns shard_bounds(Ψ of the group, N, r)")


def _mixed_step_problem(inner, step: int, avg: list, bounds: list, groups: list, masters: list, n: int) -> str:
    if len(inner.seen) != step + 1:
        return f"step {step + 1}: step() called the inner optimizer's step() {len(inner.seen) - step} times"
    for g, a, (lo, hi) in zip(inner.seen[-1]["grads"], avg, bounds):
        r = _padded(a, lo, hi)
        if g is None or g.dtype != torch.float32:
            return (f"step {step + 1}: a master's .grad is {None if g is None else g.dtype} at the inner step: "
                    "give it this rank's slice of the averaged gradient, as fp32")
        atol = 2e-2 * r.abs().max().item()        # bf16 sums, in another order
        if n > 1 and torch.allclose(g, n * r, rtol=2e-2, atol=n * atol):
            return f"step {step + 1}: the masters' gradient is the SUM over the {n} ranks: divide by N"
        if not torch.allclose(g, r, rtol=2e-2, atol=atol):
            return (f"step {step + 1}: the masters' gradient differs from the ranks' average of this slice by "
                    f"up to {(g - r).abs().max().item():.3g}")
    for g, q, (lo, hi) in zip(groups, masters, bounds):
        flat = _flat_of(p.detach() for p in g["params"] if p.requires_grad)[lo:hi]
        if not torch.equal(flat, q.detach().bfloat16()[:flat.numel()]):
            return (f"step {step + 1}: this rank's parameters do not show its masters' update: write each "
                    "master, rounded, into this rank's slice of the bf16 buffer before the all-gather")
    return ""


def _padded(flat: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Elements [lo, hi) of ``flat`` padded with zeros (the last rank's slice runs past its end)."""
    return torch.cat([flat, flat.new_zeros(hi - lo)])[lo:hi]


def _flat_of(tensors) -> torch.Tensor:
    """The tensors flattened, in order."""
    return torch.cat([t.reshape(-1) for t in tensors])


def mixed_on_rank(cls, steps: int = 2) -> list:
    """Rank side of the mixed-precision ZeRO-1: [(problem or '', seen)]."""
    return [_mixed_run(cls, steps)]


def _mixed_right(values) -> str:
    seen = values[0][0][1]
    return (f"bf16 parameters ({seen['params']:,} B), fp32 masters of P/N = {seen['shard']:,} elements; "
            f"optimizer 12·P/N + 4 per shard = {seen['optimizer']:,} B on rank 0 (K = 12); master gradients = "
            f"the ranks' average, parameters = the masters rounded, the same on every rank, 2 steps")


def check_mixed(cls) -> Verdict:
    """Exercise 04.2 (optional): ``cls(params, optimizer_class, **defaults)`` is ZeRO-1 with bf16
    parameters and fp32 masters, checked on 2, 3 and 4 ranks against the course's ``MixedZero1``:
    dtypes, masters (fp32 slices, not rounded), their gradients, parameters after 2 AdamW steps, bytes."""
    return grade_build("mixed", "MyMixedZero1", cls, mixed_on_rank, right=_mixed_right)
