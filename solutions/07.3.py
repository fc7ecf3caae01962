# Exercise 07.3: accumulate without syncing. The course's answer.
from course_utils.course.exercises import check_accumulation


def accumulation_solution(model, micro_batches):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        model.set_requires_gradient_sync(i == k - 1)    # sync only on the last one
        (model(x, y) / k).backward()                     # mean over the k micro-batches


check_accumulation(accumulation_solution)
