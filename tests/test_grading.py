"""The grading engine's reports stay short: an unfinished exercise prints a few lines
(issue 17: committed outputs of unfinished exercises are at most 5 lines)."""
from course_utils.labs.grading import SHOWN_WRONG_CASES, grade_cases, report_problems


def test_grade_cases_shows_few_wrong_cases_and_counts_the_rest(capsys):
    cases = [{"x": x} for x in range(7)]
    verdict = grade_cases(lambda x: 0 if x < 2 else (1 / 0 if x == 6 else -x), cases, lambda x: 2 * x,
                          name="double")
    lines = capsys.readouterr().out.splitlines()
    assert not verdict and len(lines) <= 4                  # + the Verdict's own line = 5
    assert lines[0] == "  double(x=1): differs: got 0, expected 2"
    assert lines[SHOWN_WRONG_CASES] == "  ... and 4 more case(s) differ"
    assert lines[-1] == "1 of 7 cases right"


def test_grade_cases_lists_every_case_when_all_are_right(capsys):
    assert grade_cases(lambda x: 2 * x, [{"x": 1}, {"x": 2}, {"x": 3}], lambda x: 2 * x, name="double")
    assert capsys.readouterr().out.splitlines() == [
        "  double(x=1): right (2)", "  double(x=2): right (4)", "  double(x=3): right (6)",
        "3 of 3 cases right"]


def test_report_problems_is_one_line(capsys):
    assert not report_problems("2 gloo ranks on CPU", ["a is wrong", "b is wrong"], "fine")
    assert report_problems("3 gloo ranks on CPU", [], "fine")
    assert capsys.readouterr().out.splitlines() == [
        "2 gloo ranks on CPU: not yet: a is wrong; b is wrong", "3 gloo ranks on CPU: right: fine"]


def test_the_learners_frame_and_the_collective_it_waits_in():
    """A hung rank's stack (innermost first): the innermost frame in the learner's code (not the
    course's package, torch or the standard library) and the collective the frames above wait in."""
    import os

    import torch

    from course_utils.labs.frames import collective_of, describe, frames_of, learner_frame
    tdist = os.path.join(os.path.dirname(torch.__file__), "distributed")
    course = os.path.dirname(os.path.dirname(frames_of.__code__.co_filename))
    stack = "\n".join([f'File "{tdist}/distributed_c10d.py", line 4943 in reduce_scatter_single',
                       f'  File "{tdist}/c10d_logger.py", line 83 in wrapper',
                       f'  File "{course}/runtime/compat.py", line 60 in reduce_scatter_tensor',
                       '  File "/tmp/ipykernel_1234/2217.py", line 79 in reduce_scatter',
                       f'  File "{course}/course/exercises/nb06.py", line 298 in zero3_on_rank'])
    frames = frames_of(stack, innermost_first=True)
    assert collective_of(frames) == "reduce_scatter_tensor"           # the name the learner called
    mine = learner_frame(frames)
    assert (mine.file, mine.line, mine.func) == ("/tmp/ipykernel_1234/2217.py", 79, "reduce_scatter")
    assert describe(mine) == "your cell, line 79 in reduce_scatter"
    getting_rank = [frames_of(f'File "{tdist}/distributed_c10d.py", line 9 in get_rank', innermost_first=True)[0]]
    assert collective_of(getting_rank + frames[3:]) == ""               # not waiting for anyone
    tb = ("Traceback (most recent call last):\n"
          f'  File "{course}/course/exercises/nb02.py", line 10, in _ddp_on_rank\n    loss.backward()\n'
          '  File "/x/answers/ddp.py", line 42, in _launch\n    bucket = self.buckets[self.next + 1]\n'
          "IndexError: list index out of range\n")
    assert describe(learner_frame(frames_of(tb, innermost_first=False))) == \
        "answers/ddp.py:42 in _launch: bucket = self.buckets[self.next + 1]"


def test_the_learners_frame_is_named_by_its_function_not_a_comprehension_or_generated_code(tmp_path):
    """A rank caught in a list comprehension (a frame of its own on Python 3.11) is said to be in
    the function around it; one caught in a dataclass's generated ``__init__`` (``<string>``, no
    source) in the learner's frame that called it (an endless loop's two ranks, seen in CI)."""
    from course_utils.labs.frames import describe, frames_of, learner_frame
    mine = tmp_path / "ddp.py"
    mine.write_text("\n" * 42 + "        flat = torch.cat([p.grad.reshape(-1) for p in bucket])\n")
    stack = "\n".join([f'File "{mine}", line 43 in <listcomp>',
                       f'  File "{mine}", line 43 in _launch',
                       f'  File "{mine}", line 60 in _finish'])
    assert describe(learner_frame(frames_of(stack, innermost_first=True))) == \
        f"{tmp_path.name}/ddp.py:43 in _launch: flat = torch.cat([p.grad.reshape(-1) for p in bucket])"
    generated = frames_of("\n".join(['File "<string>", line 8 in __init__', f'  File "{mine}", line 43 in _launch']),
                          innermost_first=True)
    assert learner_frame(generated).func == "_launch"
    alone = frames_of('File "<string>", line 3 in main', innermost_first=True)      # python -c: still the learner's
    assert learner_frame(alone).func == "main"


def test_a_rank_aborted_by_gloo_is_explained_and_the_next_world_sizes_are_not_tried(capsys, monkeypatch):
    from course_utils.labs import grading
    from course_utils.runtime.launch import LaunchError

    def aborted(*args, **kwargs):
        raise LaunchError("rank 1 was killed by signal 6 without reporting a result", rank=1, signal=6)

    monkeypatch.setattr(grading, "launch", aborted)
    runs = grading.on_world_sizes(lambda: 0, (2, 3, 4), timeout_s=5)
    assert list(runs) == [] and not runs.completed
    out = capsys.readouterr().out
    assert "2 ranks: rank 1 was killed: gloo aborted it (signal 6): this usually means the ranks called " \
           "collectives whose sizes or order differ" in out
    assert "(not tried on 3 and 4 ranks after that)" in out


def test_a_rank_that_segfaults_in_gloo_is_explained_as_a_mismatch(capsys, monkeypatch):
    """gloo can also crash (signal 11) on mismatched collectives: a CI run saw it for a bucket
    order reversed on one rank."""
    from course_utils.labs import grading
    from course_utils.runtime.launch import LaunchError

    def crashed(*args, **kwargs):
        raise LaunchError("rank 0 was killed by signal 11 without reporting a result", rank=0, signal=11)

    monkeypatch.setattr(grading, "launch", crashed)
    assert list(grading.on_world_sizes(lambda: 0, (2, 3), timeout_s=5)) == []
    out = capsys.readouterr().out
    assert "2 ranks: rank 0 was killed: it crashed inside gloo (signal 11" in out
    assert "collectives whose sizes or order differ" in out
