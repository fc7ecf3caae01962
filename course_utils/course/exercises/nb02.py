"""Exercises of ``notebooks/02_data_parallelism.ipynb``: a gradient-averaging hook."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, on_world_sizes, refuse_non_function
from ...runtime.fmt import GRAD_ATOL, bound

__all__ = ["check_grad_average_hook"]


def _grads_with_hook(hook) -> dict:
    """Rank side of :func:`check_grad_average_hook`: this rank's gradients with ``hook`` on
    every parameter, against one process's gradients on the whole batch (course GPT)."""
    import torch.distributed as dist

    from ...harness.model import SyntheticData, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    data = SyntheticData(global_batch=12, seed=0)
    reference = build_model(seed=0)
    reference(*data.batch(0)).backward()
    model = build_model(seed=0)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    model(*data.shard(0, rank, world)).backward()
    got = dict(model.named_parameters())
    missing = [n for n, p in got.items() if p.grad is None]
    worst = max(((got[n].grad - p.grad).abs().max().item() for n, p in reference.named_parameters()
                 if got[n].grad is not None), default=0.0)
    return {"max_abs_diff": worst, "missing": missing}


def check_grad_average_hook(hook: Callable) -> Verdict:
    """Exercise 02.1: ``hook(param)``, registered with ``register_post_accumulate_grad_hook``
    on every parameter, must leave ``param.grad`` equal to the gradient of the global batch
    (the average over ranks). Checked on 2, 3 and 4 ranks against one process, to 1e-6."""
    name = "grad_average_hook"
    if (refused := refuse_non_function(hook, name, "of one parameter")) is not None:
        return refused
    from ...harness.model import warm_up

    warm_up()
    all_right = True
    for n, values in (runs := on_world_sizes(_grads_with_hook, (2, 3, 4), hook, timeout_s=30)):
        for rank, v in enumerate(values):
            ok = not v["missing"] and v["max_abs_diff"] <= GRAD_ATOL
            all_right &= ok
            why = (f"no gradient for {v['missing'][:2]}" if v["missing"] else
                   f"max |grad - full-batch grad| {bound(v['max_abs_diff'], GRAD_ATOL)}")
            print(f"  rank {rank}: {'right' if ok else 'differs'} ({why})")
    return Verdict(name, all_right and runs.completed)
