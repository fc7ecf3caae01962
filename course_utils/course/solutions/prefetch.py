# Exercise 06.2 (optional): prefetch in your units. The skeleton filled in, as a learner would.
from course_utils.course.exercises import check_prefetch, hint, solution
from course_utils.impl.common import alloc_storage
from course_utils.runtime.compat import all_gather_into_tensor


class MyPrefetchUnit(MyFlatUnit):  # your MyFlatUnit, which passed check_zero3
    """Your MyFlatUnit, whose all-gather can start before the unit is needed: the model around the
    units calls prefetch() on the next unit while the current one computes."""

    def __init__(self, module):
        """MyFlatUnit's, and no all-gather on its way yet."""
        super().__init__(module)
        self.inflight = None

    def prefetch(self):
        """Starts this unit's all-gather and returns at once, keeping its handle (what async_op=True
        returns). Nothing if the unit is gathered already or its all-gather on its way."""
        if self.inflight is None and self.full.untyped_storage().nbytes() == 0:
            alloc_storage(self.full)
            self.inflight = all_gather_into_tensor(self.full, self.shard.detach(), async_op=True)

    def gather(self):
        """Every rank's shard in self.full, as before; if a prefetch is on its way, that one's."""
        if self.inflight is not None:
            self.inflight.wait()
            self.inflight = None
        else:
            super().gather()


check_prefetch(MyPrefetchUnit)
