# Exercise 05.1: build ZeRO-2 on ZeRO-1. The skeleton filled in, as a learner would.
import torch
from course_utils.course.exercises import check_zero2, hint, solution
from course_utils.impl.common import flatten_and_pad
from course_utils.impl.hooks import BucketHooks
from course_utils.impl.zero import Zero1
from course_utils.runtime.compat import reduce_scatter_tensor


class MyZero2(Zero1, BucketHooks):
    """ZeRO-1 (the course's, one flat buffer per bucket) whose gradients are reduce-scattered
    during backward, bucket by bucket, by your MyDDP's hooks (BucketHooks)."""

    def __init__(self, params, optimizer_class, bucket_bytes=25 * 2**20, **defaults):
        """ZeRO-1 lays out self.buckets; then the hooks go on, bucket by bucket."""
        super().__init__(params, optimizer_class, bucket_bytes, **defaults)  # given
        self.in_flight = None
        self.register_bucket_hooks([b.params for b in self.buckets])

    def _grad_buffers(self, bucket):
        """ZeRO-1 calls it for each bucket it lays out: the gradient that bucket keeps."""
        bucket.shard_grad = bucket.shard.grad = torch.zeros_like(bucket.shard)

    def _launch(self):
        """Sends bucket self.next, as MyDDP's hook sent its buckets, without waiting; its full
        gradients are then gone. At most one bucket's message is alive at a time."""
        self._wait()
        b = self.buckets[self.next]
        b.message = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p)
                                     for p in b.params], self.n)
        for p in b.params:
            p.grad = None
        b.work = reduce_scatter_tensor(b.message[b.lo:b.hi], b.message, async_op=True)
        self.in_flight = b
        self.next += 1

    def _wait(self):
        if self.in_flight is not None:
            b, self.in_flight = self.in_flight, None
            b.work.wait()
            b.shard_grad.add_(b.message[b.lo:b.hi])
            b.message = b.work = None

    def _finish(self):
        """When backward ends: everything sent and summed into the shards' gradients, which
        keep accumulating until step(); ready for the next backward."""
        self.queued = False
        while self.next < len(self.buckets):
            self._launch()
        self._wait()
        self.next, self.ready = 0, set()

    def _sum_gradients(self):
        """ZeRO-1's step() calls it, then divides every shard_grad by N. ZeRO-1's reduce-scatters
        each bucket's flat gradient here. What must ZeRO-2's do?"""
        pass                         # nothing: the hooks already summed every backward into the shards

    def _zero_grads(self, bucket):
        """zero_grad() calls it for each bucket."""
        bucket.shard_grad.zero_()
        for p in bucket.params:
            p.grad = None


check_zero2(MyZero2)
