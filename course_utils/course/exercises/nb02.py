"""Exercises of ``notebooks/02_data_parallelism.ipynb``: a gradient-averaging hook, then DDP."""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist

from ...labs.grading import (Verdict, carried_over, first_problem, grade_build, judge_on_ranks,
                             refuse_non_function)
from ...impl.common import make_buckets
from ...runtime.fmt import GRAD_ATOL, bound

__all__ = ["check_grad_average_hook", "check_ddp", "first_problem", "DDP_BUCKETS"]


def _grads_with_hook(hook) -> dict:
    """This rank's gradients with ``hook`` on every parameter vs one process's on the whole batch."""
    from ...harness.model import SyntheticData, build_model
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
    """Exercise 02.1: a post-accumulate-grad hook leaves the global batch's gradient in ``.grad``."""
    name = "grad_average_hook"
    if (refused := refuse_non_function(hook, name, "of one parameter")) is not None:
        return refused
    from ...harness.model import warm_up
    warm_up()
    def judge(v, rank, n):
        diff = f"max |grad - full-batch grad| {bound(v['max_abs_diff'], GRAD_ATOL)}"
        if v["missing"]:
            return f"no gradient for {v['missing'][:2]}", ""
        return ("" if v["max_abs_diff"] <= GRAD_ATOL else diff), f"has {diff}"
    return judge_on_ranks(_grads_with_hook, judge, world_sizes=(2, 3, 4), name=name, args=(hook,))


# ------------------------------------------------------------------ exercise 02.2: build DDP

#: The bucket sizes the DDP grader tries: one bucket per parameter, and torch's 25 MiB.
DDP_BUCKETS = (0, 25 * 2**20)


def _frozen_model(seed: int):
    """The course GPT (tied embedding, Ψ = 129,350) with the first block's first norm frozen, and
    a buffer (as a BatchNorm's running statistics would be) that differs with the seed."""
    from ...harness.model import build_model
    model = build_model(seed=seed)
    model.blocks[0].norm1.requires_grad_(False)
    model.register_buffer("step_count", torch.full((3,), float(seed)))
    return model


class _WatchedWork:
    """An async all-reduce's Work that notes how many gradients had arrived when it was waited for."""

    def __init__(self, work, record: dict, watch: "CollectiveWatch"):
        self._work, self._record, self._watch = work, record, watch

    def wait(self, *args, **kwargs):
        if self._record["waited"] is None:
            self._record["waited"] = self._watch.grads
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class CollectiveWatch:
    """A ledger transport (every collective goes through it while pushed): for each collective
    named in ``names`` (None: every one), how many gradients had arrived when it was issued
    (``at``) and when it was waited for (``waited``; at once for a synchronous one). ``grads``
    counts the gradient hooks' spies (:meth:`spy_on`)."""

    def __init__(self, names=("all_reduce",), buckets=None):
        self.names, self.grads, self.calls, self.buckets = names, 0, [], buckets or []
        self.arrived = []                       # the spied parameters, in the order their gradients came
        self._numels = [sum(p.numel() for p in b) for b in self.buckets]

    def reset(self) -> None:
        """Forget the last backward's gradients and calls."""
        self.grads, self.calls, self.arrived = 0, [], []

    def _arrive(self, p) -> None:
        self.grads += 1
        self.arrived.append(p)

    def _which(self, message):
        """The index of the bucket (of ``buckets``) whose gradients, joined, ``message`` holds when
        sent (None: none; past as many calls as buckets, not looked for: the count is wrong anyway)."""
        if not isinstance(message, torch.Tensor) or len(self.calls) >= len(self.buckets):
            return None
        for k, (bucket, numel) in enumerate(zip(self.buckets, self._numels)):
            if (message.numel() == numel and all(p.grad is not None for p in bucket)
                    and torch.equal(message.detach().reshape(-1),
                                    torch.cat([p.grad.reshape(-1) for p in bucket]).to(message.dtype))):
                return k
        return None

    def spy_on(self, params) -> list:
        """A gradient hook on each of ``params`` (after the learner's: registered later) that counts."""
        return [p.register_post_accumulate_grad_hook(self._arrive) for p in params]

    def __call__(self, call):
        if self.names is not None and call.name not in self.names:
            return call.run()
        # which bucket the message holds, read before it is sent: an async all-reduce may sum
        # into it on gloo's thread before run() returns
        bucket = self._which(call.args[0] if call.args else call.kwargs.get("tensor"))
        out = call.run()
        record = {"name": call.name, "at": self.grads, "waited": self.grads if out is None else None,
                  "sync": out is None, "bucket": bucket}
        self.calls.append(record)
        return out if out is None else _WatchedWork(out, record, self)


def _overlap_problem(calls: list, grads: int, per_parameter: bool) -> str:
    """'' when backward went on while an all-reduce was in flight, else what stopped the overlap.
    ``calls``: :class:`CollectiveWatch`'s records; ``grads``: the gradients of one backward."""
    last = grads - 1 if per_parameter else grads      # per parameter: issued before the last gradient
    early = [(k, c) for k, c in enumerate(calls) if c["at"] < last]
    if calls and not early:
        return ("every all-reduce started after the last gradient arrived: nothing overlapped "
                "backward; launch each bucket from _on_grad as soon as it is complete, in "
                "backward's order (make_buckets orders them so itself: give it the parameters in module order)")
    if per_parameter and early and all(c["waited"] == c["at"] for _, c in early):   # none in flight
        k, c = early[0]
        how = (f"bucket {k}'s all-reduce was synchronous (no async_op=True) inside the hook"
               if c["sync"] else f"you waited for bucket {k}'s all-reduce inside the hook")
        return how + ": backward could not go on meanwhile; launch it with async_op=True and wait in _finish"
    return ""


def _lag_problem(calls: list, buckets: list, arrived: list) -> str:
    """'' unless a bucket's all-reduce started hooks after the hook that completed it (with every
    bucket before it started): one gradient can complete several buckets, and an ``if`` where a
    ``while`` belongs starts one per hook, each later than it could. Checked when every call sent
    its own bucket in order; calls made once backward has ended (``_finish``) are not judged."""
    total = len(arrived)
    if not calls or len(calls) != len(buckets) or [c["bucket"] for c in calls] != list(range(len(calls))):
        return ""
    where = {id(p): k for k, p in enumerate(arrived)}        # a call from the hook of gradient k has at == k
    ideal, earliest = [], 0
    for bucket in buckets:
        earliest = max(earliest, max(where.get(id(p), total) for p in bucket))
        ideal.append(earliest)
    shift = calls[0]["at"] - ideal[0]       # 1 when the learner's hooks run after the spies
    if shift not in (0, 1):
        return ""
    for k, (c, want) in enumerate(zip(calls, ideal)):
        if want + shift < c["at"] < total:
            return (f"bucket {k} was complete, and every bucket before it started, when gradient {want + 1} of "
                    f"{total} arrived, but its all-reduce started only when gradient {c['at'] + 1 - shift} did: "
                    "one gradient can complete several buckets, so a hook must start every bucket that is "
                    "complete, in order, before it returns (a while, not an if)")
    return ""


def _order_problem(calls: list) -> str:
    """'' unless the all-reduces sent the buckets in another order than the buckets' own (each
    message matched to the bucket whose gradients it holds; one that matches none is judged elsewhere)."""
    sent = [c["bucket"] for c in calls]
    if None in sent or sent == list(range(len(sent))) or sorted(sent) != list(range(len(sent))):
        return ""
    k = next(i for i, b in enumerate(sent) if b != i)
    return (f"all-reduce {k} sent bucket {sent[k]}, not bucket {k}: the buckets started out of order. "
            "Gradients can complete in another order on another rank, and every rank must issue the same "
            "collectives in the same order: start only bucket self.next, then move on")


def _ddp_on_rank(cls, steps: int = 2) -> list:
    """Rank side of :func:`check_ddp`: per bucket size, (first problem or '', what was seen)."""
    from ...harness.experiments import global_loss
    from ...harness.model import SyntheticData
    from ...labs.frames import raised_at
    from ...labs.grading import error_hint
    from ...runtime import ledger as ledgers
    from ...runtime.ledger import CommLedger
    rank, world = dist.get_rank(), dist.get_world_size()
    data = SyntheticData(global_batch=12, seed=0)
    out = []
    for bucket_bytes in DDP_BUCKETS:
        ref = _frozen_model(seed=100)                  # rank 0's start, which every rank must take
        model = _frozen_model(seed=100 + rank)          # every rank starts elsewhere
        trained = sum(p.requires_grad for p in ref.parameters())
        expected_calls = trained if bucket_bytes == 0 else 1
        seen = {"bucket_bytes": bucket_bytes, "calls": None, "losses": [], "ref_losses": []}
        try:
            ddp = cls(model, bucket_bytes=bucket_bytes)
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            out.append((f"{cls.__name__}(model, bucket_bytes={bucket_bytes}) raised "
                        f"{type(exc).__name__}: {exc}{error_hint(str(exc))}{raised_at(exc)}", seen))
            continue
        problem = ""
        if not all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters())):
            problem = ("after construction the ranks' weights differ from rank 0's: broadcast every "
                       "parameter and buffer from rank 0 in __init__")
        elif not all(torch.equal(b, c) for b, c in zip(model.buffers(), ref.buffers())):
            problem = ("after construction the ranks' buffers differ from rank 0's (a model's buffers, such as "
                       "running statistics, are state too): broadcast module.buffers() from rank 0 as well")
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        ref_opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.5)
        watch = CollectiveWatch(buckets=make_buckets([p for p in model.parameters() if p.requires_grad], bucket_bytes))
        spies = watch.spy_on([p for p in model.parameters() if p.requires_grad])
        timings, first_right = [], None
        for step in range(steps):       # every rank runs every step (a rank that stopped early
            x, y = data.shard(step, rank, world)    # would leave the others in a collective)
            local = copy.deepcopy(ref)                  # this rank's own gradients, for diagnosis
            local(x, y).backward()
            watch.reset()
            with CommLedger() as ledger:
                ledgers.push_transport(watch)
                try:
                    loss = ddp(x, y)
                    loss.backward()
                finally:
                    ledgers.pop_transport(watch)
            calls = ledger.counts().get("all_reduce", 0)
            seen["calls"] = calls
            timings.append([c["at"] for c in watch.calls])
            ref_loss = ref(*data.batch(step))
            ref_loss.backward()
            if not problem and step and first_right is not None:
                problem = _state_problem(step, calls, timings)
            found = problem or _grad_problem(model, ref, local, world)
            if not problem and first_right is not None:
                found = carried_over(found, step, "state not reset at the end of _finish? gradients not zeroed?")
            problem = found
            if not problem and calls != expected_calls:
                problem = (f"{calls} all-reduces in one backward with bucket_bytes={bucket_bytes}, "
                           f"expected {expected_calls}: " + ("one per trainable parameter"
                                                             if bucket_bytes == 0 else
                                                             "one bucket holds the whole model"))
                if calls > expected_calls and calls % expected_calls == 0 and calls // expected_calls == trained:
                    problem += (f" ({calls} = {trained} x {expected_calls}: _finish ran once per gradient; "
                                "queue the callback once per backward, on its first hook (self.queued))")
            if not problem:
                problem = _overlap_problem(watch.calls, trained, bucket_bytes == 0)
            if not problem:
                problem = _order_problem(watch.calls)
            if not problem:
                problem = _lag_problem(watch.calls, watch.buckets, watch.arrived)
            if step == 0 and not problem:
                first_right = calls
            seen["losses"].append(global_loss(loss))
            seen["ref_losses"].append(ref_loss.item())
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()
            if calls != expected_calls:   # every rank counted the same calls: all stop here together
                break
        for spy in spies:
            spy.remove()
        if hasattr(ddp, "remove_hooks"):
            ddp.remove_hooks()
        out.append((problem, seen))
    return out


_NOT_RESET = ("the hooks' state was not reset at the end of _finish: whatever your class keeps between "
              "hooks (the next bucket to start, the gradients in, the all-reduces in flight, whether "
              "_finish is queued) must start afresh for the next backward")


def _state_problem(step: int, calls: int, timings: list) -> str:
    """'' when backward ``step + 1`` launched its all-reduces as the first did, else why not."""
    first, now = timings[0], timings[step]
    if len(now) != len(first):
        return (f"backward {step + 1} launched {len(now) or 'no'} all-reduces, backward 1 launched "
                f"{len(first)}: {_NOT_RESET}")
    early = sum(a < b for a, b in zip(now, first))
    if early:
        return (f"backward {step + 1} launched {early} all-reduces early, before their gradients "
                f"arrived: {_NOT_RESET}")
    return ""


def _grad_problem(model, ref, local, world: int) -> str:
    """'' or what is wrong with the first ``.grad`` that is not ``ref``'s (``local``: this rank's own)."""
    grads, own = dict(model.named_parameters()), dict(local.named_parameters())
    for name, q in ref.named_parameters():
        p = grads[name]
        if not q.requires_grad:
            if p.grad is not None:
                return f"frozen {name} got a gradient"
            continue
        if p.grad is None:
            return f"after loss.backward(), {name}.grad is None"
        if torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6):
            continue
        if world > 1 and torch.allclose(p.grad, own[name].grad, rtol=1e-5, atol=1e-7):
            return ("when loss.backward() returns, the gradients are still this rank's own: wait for "
                    "the all-reduces and write the averages into .grad at the end of backward "
                    "(a callback queued with queue_backward_callback)")
        if torch.allclose(p.grad, world * q.grad, rtol=1e-4, atol=1e-6):
            return f"the gradients are the SUM over the {world} ranks: divide by the world size"
        if world > 1 and torch.allclose(p.grad, q.grad / world, rtol=1e-4, atol=1e-7):
            return (f"the gradients are the average divided by {world} again: divide the sum by the "
                    "world size once")
        worst = (p.grad - q.grad).abs().max().item()
        return (f"after loss.backward(), {name}.grad differs from the global batch's gradient by "
                f"up to {worst:.3g}")
    return ""


def check_ddp(cls, *, timeout_s: float = 30, world_sizes=(2, 3, 4)) -> Verdict:
    """Exercise 02.2: ``cls(module, bucket_bytes=...)`` is DDP, checked on 2, 3 and 4 ranks with
    per-parameter and 25 MiB buckets, two SGD steps against one process: broadcast start,
    averaged gradients when backward returns, none for frozen parameters, one all-reduce per bucket."""
    return grade_build("ddp", "MyDDP", cls, _ddp_on_rank, right=_ddp_right, timeout_s=timeout_s,
                       world_sizes=world_sizes)


def _ddp_right(values) -> str:
    calls = [seen["calls"] for _, seen in values[0]]
    worst = max(abs(a - b) for _, seen in values[0] for a, b in zip(seen["losses"], seen["ref_losses"]))
    return (f"rank 0's weights everywhere, gradients averaged by the end of backward, all-reduces "
            f"per backward {calls} (per parameter, 25 MiB), losses = one process (|diff| "
            f"{bound(worst, 1e-5)})")
