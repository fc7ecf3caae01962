# Exercise 00.1: sum over ranks. The course's answer.
import torch
import torch.distributed as dist
from course_utils.course.exercises import check_rank_sum


def rank_sum_solution():
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


check_rank_sum(rank_sum_solution)
