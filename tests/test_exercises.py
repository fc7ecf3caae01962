"""Exercise graders: right, wrong, raising and hanging learner functions."""

import torch
import torch.distributed as dist

from course_utils.course import exercises
from course_utils.course.exercises import check_rank_sum, compare, grade_on_ranks


def test_right_answers_pass(capsys):
    def rank_sum():
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return t

    def gather_squares():
        parts = [torch.empty(1) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, torch.tensor([(dist.get_rank() + 1.0) ** 2]))
        return torch.cat(parts)

    v = check_rank_sum(rank_sum)
    assert v and repr(v) == "rank_sum: PASSED"
    assert grade_on_ranks(gather_squares, lambda r, n: torch.tensor([float((i + 1) ** 2) for i in range(n)]),
                          world_sizes=(3, 4), name="gather_squares")
    out = capsys.readouterr().out
    assert "4 gloo ranks on CPU: right: every rank returned tensor([1, 4, 9, 16])" in out
    assert len(out.splitlines()) == 4              # two graders, one line per world size each


def test_graders_run_gloo_cpu_ranks_even_where_gpus_are_visible(monkeypatch, capsys):
    """With a GPU per rank, launch's "auto" would pick NCCL, which rejects the CPU tensors
    an exercise's solution makes; graders always run gloo on the CPU, and say so."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)

    def rank_sum():
        t = torch.tensor([dist.get_rank() + 1.0])           # no device: the CPU
        dist.all_reduce(t)
        return t

    assert exercises.GRADER_BACKEND == "gloo"
    assert check_rank_sum(rank_sum)
    out = capsys.readouterr().out
    assert "2 gloo ranks on CPU: right" in out and "4 gloo ranks on CPU: right" in out
    assert "NCCL" not in out


def test_hard_coded_answer_fails_on_another_world_size(capsys):
    v = check_rank_sum(lambda: 10.0)
    assert not v and "not yet" in repr(v)
    out = capsys.readouterr().out
    assert "2 gloo ranks on CPU: not yet: rank 0: got 10, expected 3 (2 of 2 ranks differ)" in out
    assert "4 gloo ranks on CPU: not yet: rank 0: the right number, but no collective was called" in out


def test_raising_and_hanging_functions_are_reported_not_raised(capsys):
    def raises():
        raise NotImplementedError("todo")

    def hangs():
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))
        return 0.0

    assert not grade_on_ranks(raises, lambda r, n: 0, world_sizes=(2,))
    assert "rank 0 raised NotImplementedError: todo" in capsys.readouterr().out
    assert not grade_on_ranks(hangs, lambda r, n: 0.0, world_sizes=(2,), timeout_s=3)
    assert "never finished within 3 s" in capsys.readouterr().out      # the timeout fired
    assert not grade_on_ranks("nope", lambda r, n: 0)
    assert "should be a function" in capsys.readouterr().out


def test_compare():
    assert compare(torch.ones(2), torch.ones(2)) == ""
    assert "shape" in compare(torch.ones(3), torch.ones(2))
    assert "expected a tensor" in compare(None, torch.ones(2))
    assert compare(torch.tensor(3.0), 3.0) == "" and compare(3, 3.0) == ""
    assert "expected 3" in compare("3", 3.0)
    assert compare("a", "a") == "" and compare("a", "b")
    assert exercises.Verdict("x", True)


def test_grad_average_hook_checker(capsys):
    def right(param):
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()

    def summed(param):                       # forgets to divide by the world size
        dist.all_reduce(param.grad)

    assert exercises.check_grad_average_hook(right)
    assert not exercises.check_grad_average_hook(summed)
    out = capsys.readouterr().out
    assert "3 gloo ranks on CPU: right: every rank has max |grad - full-batch grad| ≤ 1e-6 ✓" in out
    assert "2 gloo ranks on CPU: not yet: rank 0: max |grad - full-batch grad| = " in out
    assert not exercises.check_grad_average_hook(lambda p: None)     # the stub: one line per world size
    assert len(capsys.readouterr().out.splitlines()) == 3           # + the verdict in a notebook


def test_brief_shows_a_few_values_from_where_they_differ():
    from course_utils.labs.grading import brief, compare_brief

    want = torch.arange(10.0)
    assert brief(want) == "tensor([0, 1, 2, 3, 4, …])" and brief(torch.tensor(3.0)) == "tensor(3)"
    assert brief(torch.full((2, 3), 0.5)) == "tensor([0.5, 0.5, 0.5, 0.5, 0.5, …], shape=(2, 3))"
    assert compare_brief(want, want, atol=0) == ""
    got = want.clone()
    got[8] = -1
    assert compare_brief(got, want, atol=0) == ("got […, 5, 6, 7, -1, 9], expected […, 5, 6, 7, 8, 9]; "
                                                "first difference at index 8")
    assert compare_brief(None, want, atol=0) == "got None, expected tensor([0, 1, 2, 3, 4, …])"
    assert "shape" in compare_brief(torch.ones(3), want, atol=0)
    assert compare_brief(2.5, 3.0, atol=0) == "got 2.5, expected 3"


def test_rank_sum_needs_a_collective(capsys):
    """Read 12: the formula n(n+1)/2 passed 00.1 without a collective."""
    def formula():
        n = dist.get_world_size()
        return torch.tensor(float(n * (n + 1) // 2))

    assert not check_rank_sum(formula)
    assert "no collective was called" in capsys.readouterr().out
