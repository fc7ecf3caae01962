"""Exercise 02.2 (build DDP): the course's DataParallel passes the grader; planted
mistakes fail with the message that names them."""

import torch
import torch.distributed as dist

from course_utils.course.exercises import check_ddp
from course_utils.course.exercises.nb02 import _ddp_on_rank, first_problem
from course_utils.impl.ddp import DataParallel
from course_utils.runtime.compat import queue_backward_callback
from course_utils.runtime.launch import launch
from toys import answer

Solution = answer("ddp")[0]["MyDDP"]


class NoDivide(DataParallel):
    def __init__(self, module, bucket_bytes):
        super().__init__(module, bucket_bytes=bucket_bytes)
        self.world_size = 1


class NoBroadcast(DataParallel):
    def _broadcast_from_rank0(self):
        pass


class AveragesInStep(DataParallel):
    def _on_grad(self, p):
        pass


class IgnoresBuckets(DataParallel):
    def __init__(self, module, bucket_bytes):
        super().__init__(module, bucket_bytes=0)


class SendsAfterBackward(DataParallel):
    """Marks each gradient but launches nothing until backward ends: right numbers, no overlap."""
    def _on_grad(self, p):
        if not self.queued:
            queue_backward_callback(self._finish)
            self.queued = True
        self.ready.add(id(p))


class ForwardOrder(DataParallel):
    """Buckets in forward order: the first bucket is complete only when backward ends."""
    def __init__(self, module, bucket_bytes):
        super().__init__(module, bucket_bytes=bucket_bytes)
        self.buckets.reverse()                  # the hooks wait on this very list


class ForgetsToReset(DataParallel):
    """Leaves its state as the first backward left it: the second launches nothing."""
    def _finish(self):
        super()._finish()
        self.next = len(self.buckets)


class AnyOrder(Solution):
    """Starts each bucket the moment it is complete, not strictly bucket self.next: the same sums
    here, but the course GPT completes parameter 64 before 65, so one bucket per parameter goes
    out of order (on another rank, in another order, a mismatch)."""
    def _on_grad(self, p):
        if not self.queued:
            queue_backward_callback(self._finish)
            self.queued = True
        self.ready.add(p)
        for bucket in self.buckets:
            if any(q is p for q in bucket) and all(q in self.ready for q in bucket):
                flat = torch.cat([q.grad.reshape(-1) for q in bucket])
                self.pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))

    def _finish(self):
        self.next = len(self.buckets)          # every bucket was started by the hooks
        super()._finish()


PLANTED = {NoDivide: "SUM over the 2 ranks: divide by the world size",
           NoBroadcast: "weights differ from rank 0's: broadcast",
           AveragesInStep: "still this rank's own",
           IgnoresBuckets: "all-reduces in one backward with bucket_bytes=26214400, expected 1",
           SendsAfterBackward: "every all-reduce started after the last gradient arrived",
           ForwardOrder: "every all-reduce started after the last gradient arrived",
           AnyOrder: "the buckets started out of order",
           ForgetsToReset: "backward 2 launched no all-reduces, backward 1 launched 66: the hooks' state "
                           "was not reset at the end of _finish"}


def _planted(rank, world_size):
    return {cls.__name__: _ddp_on_rank(cls, steps=2 if cls is ForgetsToReset else 1) for cls in PLANTED}


def test_the_course_ddp_passes(capsys):
    assert check_ddp(DataParallel)
    out = capsys.readouterr().out
    for n in (2, 3, 4):
        assert f"{n} gloo ranks on CPU: right: rank 0's weights everywhere" in out
    assert "[66, 1]" in out                       # one all-reduce per parameter, then one bucket


def test_planted_mistakes_are_named():
    found = launch(_planted, 2, quiet=True)
    for cls, message in PLANTED.items():
        first = first_problem([per[cls.__name__] for per in found])
        assert first and message in first[1], (cls.__name__, first)


def test_the_watch_names_a_messages_bucket_even_when_the_all_reduce_has_already_summed_it():
    """gloo may finish an async all-reduce before ``run()`` returns: the watch must read which
    bucket a message holds before sending it (CI once passed AnyOrder when it read it after)."""
    from course_utils.course.exercises.nb02 import CollectiveWatch
    from course_utils.runtime.ledger import Call

    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    for k, p in enumerate(params):
        p.grad = torch.full((3,), float(k + 1))
    watch = CollectiveWatch(buckets=[[p] for p in params])

    def summed_at_once(tensor, async_op=False):    # a 2-rank all-reduce done before it returns
        tensor.mul_(2)

    for k in (1, 0):                               # out of order
        message = params[k].grad.clone()
        watch(Call("c10d", "all_reduce", None, summed_at_once, (message,), {}))
    assert [c["bucket"] for c in watch.calls] == [1, 0]


def test_a_non_class_is_refused(capsys):
    assert not check_ddp(lambda m: m)
    assert "check_ddp takes your class" in capsys.readouterr().out


def test_the_reference_has_the_exercise_shape_and_no_bookkeeping():
    """Notebook 02 prints these methods as "the algorithm": MyDDP's names, nothing measured in them."""
    import inspect

    import course_utils.impl.common as common
    import course_utils.impl.ddp as ddp
    import course_utils.impl.zero as zero

    for name in ("__init__", "forward", "_on_grad", "_launch", "_finish"):
        assert callable(getattr(DataParallel, name))
    for module in (ddp, zero, common):
        source = inspect.getsource(module).lower()
        for word in ("_log", "peak", "ledger", "event", "perf_counter", "timeline"):
            assert word not in source, (module.__name__, word)
