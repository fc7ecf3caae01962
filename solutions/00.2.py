# Exercise 00.2: gather. The course's answer.
import torch
import torch.distributed as dist
from course_utils.course.exercises import check_gather_squares


def gather_squares_solution():
    mine = torch.tensor([(dist.get_rank() + 1.0) ** 2])
    parts = [torch.empty(1) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    return torch.cat(parts)


check_gather_squares(gather_squares_solution)
