# Exercise 04.2: a ZeRO-1 step with SGD. The course's answer.
import torch
import torch.distributed as dist
from course_utils.course.exercises import check_zero1_step
from course_utils.runtime.compat import all_gather_into_tensor, reduce_scatter_tensor


def zero1_sgd_step_solution(flat_param, flat_grad, lr):
    n, rank = dist.get_world_size(), dist.get_rank()
    size = flat_param.numel() // n
    shard_grad = torch.empty(size)
    reduce_scatter_tensor(shard_grad, flat_grad)
    mine = flat_param[rank * size:(rank + 1) * size] - lr * shard_grad / n
    all_gather_into_tensor(flat_param, mine)
    return flat_param


check_zero1_step(zero1_sgd_step_solution)
