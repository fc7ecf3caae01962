# Exercise 07.2: clip the sharded gradients. The course's answer.
import torch
from course_utils.course.exercises import check_sharded_clip


def sharded_clip_solution(model, max_norm):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


check_sharded_clip(sharded_clip_solution)
