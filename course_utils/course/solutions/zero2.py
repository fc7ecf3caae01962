# Exercise 05.1: build ZeRO-2. The skeleton filled in, as a learner would.
import torch
import torch.distributed as dist
from torch import nn
from course_utils.course.exercises import check_zero2
from course_utils.impl.common import flatten_and_pad, make_buckets
from course_utils.theory.layout import shard_bounds
from course_utils.runtime.compat import all_gather_into_tensor, queue_backward_callback, reduce_scatter_tensor


def hyper(group):
    return {k: v for k, v in group.items() if k != "params"}


class MyZero2(torch.optim.Optimizer):
    def __init__(self, params, optimizer_class, bucket_bytes=25 * 2**20, **defaults):
        super().__init__(params, defaults)
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.buckets, inner_groups = [], []
        for group in self.param_groups:
            trained = [p for p in group["params"] if p.requires_grad]
            made = [self._layout(b) for b in make_buckets(trained, bucket_bytes)]
            self.buckets += made
            inner_groups.append({**hyper(group), "params": [b["shard"] for b in made]})
        self.inner = optimizer_class(inner_groups, **defaults)
        self.bucket_of = {id(p): b for b in self.buckets for p in b["params"]}
        self.next, self.queued = 0, False
        for b in self.buckets:               # given: MyDDP's hooks, on these buckets
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

    def _on_grad(self, p):                   # given: MyDDP's, in order
        if not self.queued:
            queue_backward_callback(self._finish)
            self.queued = True
        self.bucket_of[id(p)]["ready"].add(id(p))
        while self.next < len(self.buckets) and \
                len(self.buckets[self.next]["ready"]) == len(self.buckets[self.next]["params"]):
            self._launch(self.buckets[self.next])
            self.next += 1

    @torch.no_grad()
    def _launch(self, bucket):                                            # TODO 1
        bucket["message"] = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p)
                                             for p in bucket["params"]], self.n)
        for p in bucket["params"]:
            p.grad = None
        lo, hi = bucket["lo"], bucket["hi"]
        bucket["work"] = reduce_scatter_tensor(bucket["message"][lo:hi], bucket["message"], async_op=True)

    @torch.no_grad()
    def _finish(self):                                                    # TODO 2
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
            inner.update(hyper(group))
        self.inner.step()
        for b in self.buckets:
            all_gather_into_tensor(b["flat"], b["flat"][b["lo"]:b["hi"]])
            b["shard"].grad.zero_()


check_zero2(MyZero2)
