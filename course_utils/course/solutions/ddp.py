# Exercise 02.2: build DDP. The skeleton filled in, as a learner would.
import torch
import torch.distributed as dist
from torch import nn
from course_utils.course.exercises import check_ddp, hint, solution
from course_utils.impl.common import make_buckets
from course_utils.runtime.compat import queue_backward_callback


class MyDDP(nn.Module):
    """Wraps a model. After loss.backward(), every trainable .grad is the average over the ranks."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        """All ranks start from rank 0's weights and buffers. Gradients travel in buckets, cut in
        the order backward produces them; __init__ has autograd call self._on_grad(param)
        once that parameter's gradient is complete."""
        super().__init__()  # given
        self.module = module  # given
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = make_buckets(params, bucket_bytes)
        self.next, self.ready, self.pending, self.queued = 0, set(), [], False
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)  # given

    def _on_grad(self, p):
        """The first call of a backward arranges for self._finish to run when backward ends.
        Starts the all-reduce of every bucket whose gradients are all in, strictly in bucket
        order, without waiting for it."""
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

    def _finish(self):
        """When backward ends: starts what was not started, waits, leaves the averages in .grad,
        and is ready for the next backward."""
        while self.next < len(self.buckets):
            self._launch()
        for bucket, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for p, avg in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad = avg.view_as(p).clone()
        self.next, self.ready, self.pending, self.queued = 0, set(), [], False


check_ddp(MyDDP)
