"""The builds as the spine: ``yours`` hands the cells after a build the learner's class once it
passed its check (else the reference, saying so), ``run(..., impl=...)`` measures it, and
``solution`` prints the reference on demand. The classes below are the exercises' skeletons
filled in as a learner would, not subclasses of the course's."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils.course.exercises import BUILDS, check_ddp, solution, yours
from course_utils.harness import experiments
from course_utils.harness.grading import PASSED
from course_utils.impl.common import flatten_and_pad
from course_utils.impl.ddp import DataParallel
from course_utils.impl.zero import Zero1
from course_utils.runtime.compat import all_gather_into_tensor, queue_backward_callback, reduce_scatter_tensor
from course_utils.theory.layout import shard_bounds


class MyDDP(nn.Module):
    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)
        self.buckets, current, size = [], [], 0
        for p in params[::-1]:
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        self.buckets += [current] if current else []
        self.next, self.ready, self.pending, self.queued = 0, set(), [], False
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad(self, p):
        if not self.queued:
            queue_backward_callback(self._finish)
            self.queued = True
        self.ready.add(p)
        while self.next < len(self.buckets) and all(q in self.ready for q in self.buckets[self.next]):
            self._launch()

    def _launch(self):
        bucket = self.buckets[self.next]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
        self.pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
        self.next += 1

    @torch.no_grad()
    def _finish(self):
        while self.next < len(self.buckets):
            self._launch()
        for bucket, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for p, avg in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad = avg.view_as(p).clone()
        self.next, self.ready, self.pending, self.queued = 0, set(), [], False


class MyZero1(torch.optim.Optimizer):
    def __init__(self, params, optimizer_class, **defaults):
        super().__init__(params, defaults)
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.flats, inner_groups = [], []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.requires_grad]
            flat = flatten_and_pad([p.detach() for p in params], self.n)
            off = 0
            for p in params:
                p.data = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            lo, hi = shard_bounds(off, self.n, self.rank)
            shard = nn.Parameter(flat[lo:hi])
            shard.grad = torch.zeros_like(shard)
            inner_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [shard]})
            self.flats.append({"group": group, "params": params, "flat": flat, "lo": lo, "hi": hi, "shard": shard})
        self.inner = optimizer_class(inner_groups, **defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for f, inner in zip(self.flats, self.inner.param_groups):
            grads = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p) for p in f["params"]],
                                    self.n)
            reduce_scatter_tensor(f["shard"].grad, grads)
            f["shard"].grad /= self.n
            inner.update({k: v for k, v in f["group"].items() if k != "params"})
        self.inner.step()
        for f in self.flats:
            all_gather_into_tensor(f["flat"], f["flat"][f["lo"]:f["hi"]].clone())


@pytest.fixture(autouse=True)
def _fresh_registry():
    PASSED.clear()
    yield
    PASSED.clear()


def test_an_unchecked_class_runs_the_reference(capsys):
    assert yours("zero1", MyZero1) is Zero1
    assert yours("ddp", None) is DataParallel
    out = capsys.readouterr().out
    assert "your MyZero1 has not passed check_zero1 yet: running the course's Zero1" in out
    assert "your MyDDP has not passed check_ddp yet: running the course's DataParallel" in out


def test_a_class_that_passed_is_the_one_measured(capsys):
    assert check_ddp(MyDDP)
    assert yours("ddp", MyDDP) is MyDDP
    assert "running your MyDDP (it passed check_ddp)" in capsys.readouterr().out
    mine = experiments.run("ddp", 2, steps=2, impl=MyDDP, quiet=True)
    ref = experiments.run("ddp", 2, steps=2, quiet=True)
    single = experiments.run("single", 1, steps=2)[0]
    assert max(abs(a - b) for a, b in zip(mine[0].losses, single.losses)) < 1e-5
    assert mine[0].comm_bytes == ref[0].comm_bytes
    assert mine[0].state_bytes["params"] == ref[0].state_bytes["params"]


def test_a_redefined_class_must_pass_again(capsys):
    class Other(MyDDP):
        pass
    PASSED["ddp"] = MyDDP
    assert yours("ddp", Other) is DataParallel


def test_learners_zero1_measures_its_own_bytes():
    mine = experiments.run("zero1", 2, steps=2, impl=MyZero1, quiet=True)
    ref = experiments.run("zero1", 2, steps=2, quiet=True)
    assert mine[0].losses == pytest.approx(ref[0].losses, rel=1e-6)
    assert mine[0].comm_bytes == ref[0].comm_bytes
    assert mine[0].state_bytes["optimizer"] == ref[0].state_bytes["optimizer"]
    assert mine[0].param_digest == mine[1].param_digest


def test_impl_runs_as_it_is():
    with pytest.raises(ValueError, match="impl=MyZero1 runs your class as it is: drop variant"):
        experiments.run("zero1", 2, steps=1, impl=MyZero1, variant="allreduce", quiet=True)
    with pytest.raises(TypeError, match="impl must be a class"):
        experiments.run("ddp", 2, steps=1, impl="MyDDP", quiet=True)


@pytest.mark.parametrize("name", list(BUILDS))
def test_solution_prints_the_reference(name, capsys):
    solution(name)
    out = capsys.readouterr().out
    learner, ref, methods = BUILDS[name]
    assert f"{learner}'s shape" in out and all(f"def {m.__name__}(" in out for m in methods)


def test_solution_names_the_exercises():
    with pytest.raises(ValueError, match="known exercises: 00.1, .*, ddp, zero1, zero2, zero3"):
        solution("zero4")


def _hyper(group):
    return {k: v for k, v in group.items() if k != "params"}


class MyZero2(torch.optim.Optimizer):
    """05's skeleton filled in: ZeRO-1's layout per bucket, hooks, a _finish per backward."""

    def __init__(self, params, optimizer_class, bucket_bytes=25 * 2**20, **defaults):
        from course_utils.impl.common import make_buckets
        super().__init__(params, defaults)
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.buckets, inner_groups = [], []
        for group in self.param_groups:
            trained = [p for p in group["params"] if p.requires_grad]
            made = [self._layout(b) for b in make_buckets(trained, bucket_bytes)]
            self.buckets += made
            inner_groups.append({**_hyper(group), "params": [b["shard"] for b in made]})
        self.inner = optimizer_class(inner_groups, **defaults)
        self.bucket_of = {id(p): b for b in self.buckets for p in b["params"]}
        self.next, self.queued = 0, False
        for b in self.buckets:
            for p in b["params"]:
                p.register_post_accumulate_grad_hook(self._on_grad)

    @torch.no_grad()
    def _layout(self, params):
        flat = flatten_and_pad([p.detach() for p in params], self.n)
        offsets = [0]
        for p in params:
            p.data = flat[offsets[-1]:offsets[-1] + p.numel()].view_as(p)
            offsets.append(offsets[-1] + p.numel())
        lo, hi = shard_bounds(offsets[-1], self.n, self.rank)
        shard = nn.Parameter(flat[lo:hi])
        shard.grad = torch.zeros_like(shard)
        return {"params": params, "flat": flat, "lo": lo, "hi": hi, "shard": shard,
                "ready": set(), "message": None, "work": None}

    def _on_grad(self, p):
        if not self.queued:
            queue_backward_callback(self._finish)
            self.queued = True
        self.bucket_of[id(p)]["ready"].add(id(p))
        while self.next < len(self.buckets) and \
                len(self.buckets[self.next]["ready"]) == len(self.buckets[self.next]["params"]):
            self._launch(self.buckets[self.next])
            self.next += 1

    @torch.no_grad()
    def _launch(self, b):
        b["message"] = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p)
                                        for p in b["params"]], self.n)
        for p in b["params"]:
            p.grad = None
        b["work"] = reduce_scatter_tensor(b["message"][b["lo"]:b["hi"]], b["message"], async_op=True)

    @torch.no_grad()
    def _finish(self):
        while self.next < len(self.buckets):
            self._launch(self.buckets[self.next])
            self.next += 1
        for b in self.buckets:
            b["work"].wait()
            b["shard"].grad += b["message"][b["lo"]:b["hi"]] / self.n
            b["message"], b["work"], b["ready"] = None, None, set()
        self.next, self.queued = 0, False

    @torch.no_grad()
    def step(self, closure=None):
        for inner, group in zip(self.inner.param_groups, self.param_groups):
            inner.update(_hyper(group))
        self.inner.step()
        for b in self.buckets:
            all_gather_into_tensor(b["flat"], b["flat"][b["lo"]:b["hi"]].clone())
            b["shard"].grad.zero_()


class FinishesInStep(MyZero2):
    """The design that cannot accumulate: what is left is sent from step(), once."""

    def _on_grad(self, p):
        self.bucket_of[id(p)]["ready"].add(id(p))
        while self.next < len(self.buckets) and \
                len(self.buckets[self.next]["ready"]) == len(self.buckets[self.next]["params"]):
            self._launch(self.buckets[self.next])
            self.next += 1

    def step(self, closure=None):
        self._finish()
        return super().step(closure)


def test_learners_zero2_passes_and_accumulates(capsys):
    from course_utils.course.exercises import check_zero2
    assert check_zero2(MyZero2)
    assert not check_zero2(FinishesInStep)
    assert "the step's second backward (gradient accumulation) sent nothing" in capsys.readouterr().out
    mine = experiments.run("zero2", 2, steps=2, impl=MyZero2, quiet=True)
    ref = experiments.run("zero2", 2, steps=2, quiet=True)
    assert mine[0].losses == pytest.approx(ref[0].losses, rel=1e-6)
    assert mine[0].comm_calls == ref[0].comm_calls
    assert mine[0].state_bytes["grads"] == ref[0].state_bytes["grads"]


def test_versus_hides_the_measurement_until_there_is_a_prediction(capsys):
    from course_utils.course.exercises import versus
    versus(None, 258_708, "optimizer bytes")
    versus(258_700, 258_708, "optimizer bytes")
    versus(129_354, 258_708, "optimizer bytes")
    none, close, off = capsys.readouterr().out.splitlines()
    assert "258" not in none and "predict first" in none
    assert close.endswith("measured 258,708: right") and off.endswith("off by 50%")
