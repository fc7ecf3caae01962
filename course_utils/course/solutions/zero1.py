# Exercise 04.1: build ZeRO-1. The skeleton filled in, as a learner would.
import torch
import torch.distributed as dist
from torch import nn
from course_utils.course.exercises import check_zero1, hint, solution
from course_utils.impl.common import flatten_and_pad
from course_utils.theory.layout import shard_bounds
from course_utils.runtime.compat import all_gather_into_tensor, reduce_scatter_tensor


def hyper(group):                                    # a group's hyperparameters: all but its params
    return {k: v for k, v in group.items() if k != "params"}


class MyZero1(torch.optim.Optimizer):
    """MyZero1(params, torch.optim.AdamW, lr=...) trains like AdamW(params, lr=...), but this
    rank's AdamW holds the state of its 1/N of each parameter group only."""

    def __init__(self, params, optimizer_class, **defaults):
        """Per parameter group, the trainable parameters become views of one flat buffer padded
        to a multiple of N; this rank owns one slice of it, its shard. optimizer_class is built
        once, over the shards, each with its group's hyperparameters."""
        super().__init__(params, defaults)           # given: self.param_groups: your groups, as given
        self.n, self.rank = dist.get_world_size(), dist.get_rank()  # given
        self.flats, inner_groups = [], []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.requires_grad]
            if not params:                           # a group of frozen parameters: nothing to shard
                continue
            flat = flatten_and_pad([p.detach() for p in params], self.n)
            off = 0
            for p in params:
                p.data = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            lo, hi = shard_bounds(off, self.n, self.rank)
            shard = nn.Parameter(flat[lo:hi])
            shard.grad = torch.zeros_like(shard)
            inner_groups.append({**hyper(group), "params": [shard]})
            self.flats.append({"group": group, "params": params, "flat": flat, "lo": lo, "hi": hi,
                               "shard": shard})
        self.inner = optimizer_class(inner_groups, **defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """Each shard's gradient becomes the ranks' average of its slice; the inner optimizer
        steps the shards with your groups' current hyperparameters (a scheduler changes them);
        then every rank holds every updated slice again."""
        with torch.enable_grad():                    # given: torch optimizers' step(closure) signature: nothing to do
            loss = closure() if closure is not None else None  # given
        for f, inner in zip(self.flats, self.inner.param_groups):
            grads = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p)
                                     for p in f["params"]], self.n)
            reduce_scatter_tensor(f["shard"].grad, grads)
            f["shard"].grad /= self.n
            inner.update(hyper(f["group"]))
        self.inner.step()
        for f in self.flats:
            all_gather_into_tensor(f["flat"], f["flat"][f["lo"]:f["hi"]])
        return loss                                  # given


check_zero1(MyZero1)
