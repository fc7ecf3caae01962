# Exercise 06.1: build ZeRO-3, a flat unit. The skeleton filled in, as a learner would.
import torch
import torch.distributed as dist
from torch import nn
from course_utils.course.exercises import check_zero3, hint, solution
from course_utils.impl.common import alloc_storage, free_storage
from course_utils.theory.layout import padded_numel
from course_utils.runtime.compat import all_gather_into_tensor, reduce_scatter_tensor


class MyFlatUnit(nn.Module):
    """Wraps one unit. Between its uses, a rank holds 1/N of its trainable parameters: the shard."""

    def __init__(self, module):
        """The trainable parameters become views of one flat buffer, self.full, padded to a
        multiple of N; self.shard, an nn.Parameter, keeps a copy of this rank's chunk; then
        self.full is freed. __init__ has autograd call self._grad_ready(param) once that
        parameter's gradient is complete."""
        super().__init__()  # given
        self.module = module  # given
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.padded = padded_numel(sum(p.numel() for p in self.params), self.world)
        self.full = torch.zeros(self.padded, dtype=self.params[0].dtype, device=self.params[0].device)
        off = 0
        for p in self.params:
            self.full[off:off + p.numel()] = p.detach().reshape(-1)
            p.data = self.full[off:off + p.numel()].view(p.shape)
            off += p.numel()
        size = self.padded // self.world
        self.shard = nn.Parameter(self.full[self.rank * size:(self.rank + 1) * size].clone())
        self.free()
        self.ready = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def gather(self):
        """self.full's memory back, holding every rank's shard."""
        alloc_storage(self.full)
        all_gather_into_tensor(self.full, self.shard.detach())

    def free(self):
        """self.full's memory given back."""
        free_storage(self.full)

    def forward(self, *args):
        """Runs the module with its full weights, which are freed again before it returns;
        backward will need them back (under torch.no_grad(), evaluation, no backward comes)."""
        self.gather()
        out = self.module(*args)
        self.free()
        if out.requires_grad:              # under torch.no_grad() no backward will come
            out.register_hook(self._before_backward)
        return out

    def _before_backward(self, grad):
        self.gather()
        return grad

    @torch.no_grad()
    def _grad_ready(self, p):
        """Once all the unit's gradients are in: self.reduce_scatter()."""
        self.ready += 1
        if self.ready == len(self.params):
            self.reduce_scatter()

    @torch.no_grad()
    def reduce_scatter(self):
        """The shard's gradient gets the ranks' average of this rank's chunk of the flat
        gradient, added to what is there (two backwards before a step accumulate); then no
        full gradient or weight is left."""
        flat = torch.zeros(self.padded, dtype=self.shard.dtype, device=self.shard.device)
        off = 0
        for p in self.params:
            if p.grad is not None:
                flat[off:off + p.numel()] = p.grad.reshape(-1)
            p.grad = None
            off += p.numel()
        mine = torch.empty_like(self.shard)
        reduce_scatter_tensor(mine, flat)
        mine /= self.world
        self.shard.grad = mine if self.shard.grad is None else self.shard.grad + mine
        self.ready = 0
        self.free()


check_zero3(MyFlatUnit)
