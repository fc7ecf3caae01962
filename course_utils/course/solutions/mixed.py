# Exercise 04.2 (optional): ZeRO-1 in mixed precision. The skeleton filled in, as a learner would.
import torch
import torch.distributed as dist
from torch import nn
from course_utils.course.exercises import check_mixed, hint, solution
from course_utils.impl.common import flatten_and_pad
from course_utils.theory.layout import shard_bounds
from course_utils.runtime.compat import all_gather_into_tensor, reduce_scatter_tensor


def hyper(group):                                    # a group's hyperparameters: all but its params
    return {k: v for k, v in group.items() if k != "params"}


class MyMixedZero1(torch.optim.Optimizer):
    """MyZero1 in mixed precision: the model's trainable parameters, and so its gradients, are
    bf16 (2 bytes each); the inner optimizer steps an fp32 master copy of this rank's shard, so
    a rank holds K = 4 + 8 = 12 bytes of optimizer state per element of its shard."""

    def __init__(self, params, optimizer_class, **defaults):
        """MyZero1's layout, with two changes: the flat buffer the parameters view is bf16, and
        the shard the inner optimizer steps is an fp32 copy of this rank's slice (the master),
        taken before the values are rounded to bf16."""
        super().__init__(params, defaults)           # given: self.param_groups: your groups, as given
        self.n, self.rank = dist.get_world_size(), dist.get_rank()  # given
        self.flats, inner_groups = [], []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.requires_grad]
            if not params:                           # a group of frozen parameters: nothing to shard
                continue
            full = flatten_and_pad([p.detach() for p in params], self.n)           # fp32
            lo, hi = shard_bounds(sum(p.numel() for p in params), self.n, self.rank)
            master = nn.Parameter(full[lo:hi].clone())
            flat = full.to(torch.bfloat16)
            off = 0
            for p in params:
                p.data = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            inner_groups.append({**hyper(group), "params": [master]})
            self.flats.append({"group": group, "params": params, "flat": flat, "lo": lo, "hi": hi,
                               "master": master})
        self.inner = optimizer_class(inner_groups, **defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """MyZero1's step, with two changes: the master's gradient is fp32 (this rank's slice of
        the reduce-scattered bf16 gradient, converted, averaged); after the inner step, the
        master, rounded to bf16, is what this rank's slice of the flat buffer sends."""
        with torch.enable_grad():                    # given: torch optimizers' step(closure) signature: nothing to do
            loss = closure() if closure is not None else None  # given
        for f, inner in zip(self.flats, self.inner.param_groups):
            grads = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p)
                                     for p in f["params"]], self.n)
            mine = torch.empty(f["hi"] - f["lo"], dtype=grads.dtype)
            reduce_scatter_tensor(mine, grads)
            f["master"].grad = mine.float() / self.n
            inner.update(hyper(f["group"]))
        self.inner.step()
        for f in self.flats:
            f["flat"][f["lo"]:f["hi"]] = f["master"]
            all_gather_into_tensor(f["flat"], f["flat"][f["lo"]:f["hi"]])
        return loss                                  # given


check_mixed(MyMixedZero1)
