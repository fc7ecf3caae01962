"""Exercise 06.2 (optional, prefetch in the learner's units): the answer, and right ones written
otherwise, pass the grader; planted mistakes (among them a reviewer's set of typical ones) fail with
the message that names them; the units prefetch as the course's ``Zero3`` does,
with the same collectives and losses, and on the modelled network the wait for all-gathers falls."""
import pytest
import torch

from course_utils.course.exercises import check_prefetch, skeleton, yours
from course_utils.course.exercises.nb06 import prefetch_on_rank
from course_utils.impl.common import alloc_storage
from course_utils.impl.zero3 import FlatUnit, Zero3
from course_utils.labs.grading import PASSED, first_problem
from course_utils.runtime.compat import all_gather_into_tensor
from course_utils.runtime.launch import launch
from toys import answer

MyFlatUnit = answer("zero3")[0]["MyFlatUnit"]
Solution = answer("prefetch", {"MyFlatUnit": MyFlatUnit})[0]["MyPrefetchUnit"]


class NoStart(Solution):
    def __init__(self, module):
        MyFlatUnit.__init__(self, module)


class PrefetchDoesNothing(Solution):
    def prefetch(self):
        pass


class BlockingPrefetch(Solution):
    def prefetch(self):
        if self.inflight is None and self.full.untyped_storage().nbytes() == 0:
            alloc_storage(self.full)
            self.inflight = all_gather_into_tensor(self.full, self.shard.detach())


class WaitsInPrefetch(Solution):
    def prefetch(self):
        super().prefetch()
        if self.inflight is not None:
            self.inflight.wait()


class NoGuard(Solution):
    def prefetch(self):
        alloc_storage(self.full)
        self.inflight = all_gather_into_tensor(self.full, self.shard.detach(), async_op=True)


class GathersAnyway(Solution):
    def gather(self):
        MyFlatUnit.gather(self)


class NeverWaits(Solution):
    def gather(self):
        if self.inflight is not None:
            self.inflight = None
        else:
            MyFlatUnit.gather(self)


class NeverForgets(Solution):
    def gather(self):
        if self.inflight is not None:
            self.inflight.wait()
        else:
            MyFlatUnit.gather(self)


class NoGuardWhenGathered(Solution):
    def prefetch(self):
        if self.inflight is None:
            alloc_storage(self.full)
            self.inflight = all_gather_into_tensor(self.full, self.shard.detach(), async_op=True)


class NoDetach(Solution):
    def prefetch(self):
        if self.inflight is None and self.full.untyped_storage().nbytes() == 0:
            alloc_storage(self.full)
            self.inflight = all_gather_into_tensor(self.full, self.shard, async_op=True)


class NoAlloc(Solution):
    def prefetch(self):
        if self.inflight is None and self.full.untyped_storage().nbytes() == 0:
            self.inflight = all_gather_into_tensor(self.full, self.shard.detach(), async_op=True)


class KeepsIfCompleted(Solution):            # the handle forgotten only when it was not yet complete
    def gather(self):
        if self.inflight is not None:
            if not self.inflight.is_completed():
                self.inflight.wait()
                self.inflight = None
        else:
            MyFlatUnit.gather(self)


class SharedHandles(Solution):               # one list of handles for every unit
    pending = []

    def prefetch(self):
        if self.full.untyped_storage().nbytes() == 0:
            alloc_storage(self.full)
            self.pending.append(all_gather_into_tensor(self.full, self.shard.detach(), async_op=True))

    def gather(self):
        if self.full.untyped_storage().nbytes() > 0 and self.pending:
            self.pending.pop().wait()
        else:
            MyFlatUnit.gather(self)


class RebindsFull(Solution):
    def prefetch(self):
        if self.inflight is None and self.full.untyped_storage().nbytes() == 0:
            self.full = torch.empty(self.padded, dtype=self.shard.dtype)
            self.inflight = all_gather_into_tensor(self.full, self.shard.detach(), async_op=True)


# right, written otherwise: a future's wait, the list form of all-gather, polling until complete
class WaitsOnFuture(Solution):
    def gather(self):
        if self.inflight is None:
            return MyFlatUnit.gather(self)
        self.inflight.get_future().wait()
        self.inflight = None


class GathersIntoChunks(Solution):
    def prefetch(self):
        if self.inflight is None and self.full.untyped_storage().nbytes() == 0:
            alloc_storage(self.full)
            self.inflight = torch.distributed.all_gather(list(self.full.chunk(self.world)), self.shard.detach(),
                                                         async_op=True)


class PollsUntilComplete(Solution):
    def gather(self):
        if self.inflight is not None:
            while not self.inflight.is_completed():
                pass
            self.inflight = None
        else:
            MyFlatUnit.gather(self)


RIGHT = (WaitsOnFuture, GathersIntoChunks, PollsUntilComplete)

PLANTED = {NoGuardWhenGathered: "prefetch() on a unit already gathered started another all-gather",
           NoDetach: "gather self.shard.detach()",
           NoAlloc: "give it its memory back (alloc_storage) before the all-gather",
           KeepsIfCompleted: "gather() must forget the handle it waited for",
           SharedHandles: "keep each unit's handle on that unit",
           RebindsFull: "self.full is a new tensor",
NoStart: "the unit alone raised AttributeError",
           PrefetchDoesNothing: "prefetch() started no all-gather",
           BlockingPrefetch: "prefetch() waited for its all-gather: it must return at once",
           WaitsInPrefetch: "prefetch() waited for its all-gather: it must return at once",
           NoGuard: "a second prefetch() of a unit already on its way started another all-gather",
           GathersAnyway: "gather() started an all-gather of its own while a prefetch was on its way",
           NeverWaits: "gather() returned before the prefetch's data arrived",
           NeverForgets: "gather() must forget the handle it waited for"}


def _planted():
    return {cls.__name__: prefetch_on_rank(cls) for cls in (Solution, *RIGHT, *PLANTED)}


def test_the_answer_passes_and_planted_mistakes_are_named(capsys):
    assert check_prefetch(Solution)
    out = capsys.readouterr().out
    for n in (2, 3, 4):
        assert (f"{n} gloo ranks on CPU: right: prefetch() returns at once, gather() waits for it: 9 all-gathers "
                "per step, as without prefetch; the next block's on its way while each block computes, at most "
                "3 of 5 units gathered") in out
    found = launch(_planted, 2, quiet=True)
    for cls in (Solution, *RIGHT):
        assert first_problem([per[cls.__name__] for per in found]) is None, cls.__name__
    for cls, message in PLANTED.items():
        first = first_problem([per[cls.__name__] for per in found])
        assert first and message in first[1], (cls.__name__, first)


def test_the_skeleton_subclasses_the_learners_unit():
    text = skeleton("prefetch")
    assert "class MyPrefetchUnit(MyFlatUnit):" in text and "check_prefetch(MyPrefetchUnit)" in text
    assert "inflight" not in text and "wait()" not in text     # the handle's name is the learner's


def test_without_a_pass_the_course_zero3_stands_in(capsys):
    PASSED.clear()
    assert yours("prefetch", Solution) is Zero3
    assert "running the course's Zero3" in capsys.readouterr().out


def _wrapped(cls, overlap):
    from course_utils.harness import experiments as ex
    from course_utils.harness.model import build_model
    model, _ = ex.wrap("zero3", build_model(seed=0), torch.optim.SGD, impl=cls, overlap=overlap)
    return type(model).__name__, getattr(model, "prefetch", None)


def test_wrap_prefetches_only_a_unit_that_can():
    assert launch(_wrapped, 2, Solution, True, quiet=True)[0] == ("UnitModel", True)
    assert launch(_wrapped, 2, Solution, False, quiet=True)[0] == ("UnitModel", False)
    assert launch(_wrapped, 2, FlatUnit, True, quiet=True)[0] == ("UnitModel", False)
    assert launch(_wrapped, 2, Zero3, True, quiet=True)[0] == ("Zero3", True)
