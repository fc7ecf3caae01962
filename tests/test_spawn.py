"""Demos and graders with ranks started as on macOS (from a forkserver) and Windows
(spawned): functions defined where the learner defines them (a notebook cell, here a test
body) travel to the ranks by value."""
import os

import pytest
import torch
import torch.distributed as dist

from course_utils.labs import collectives_lab as collectives
from course_utils.course import exercises
from course_utils.harness import experiments
from course_utils.runtime.fmt import LOSS_RTOL
from course_utils.runtime.launch import describe_plan, launch
from course_utils.runtime.magics import ranks


# `make test` runs these under the forkserver (spawn's launches cost seconds each; the
# launcher's own spawn tests stay in it); `make test-spawn` under each method in turn.
_METHODS = [os.environ.get("COURSE_SPAWN_TESTS", "forkserver")]


@pytest.fixture(autouse=True, params=_METHODS)
def forced_method(request, monkeypatch):
    monkeypatch.setenv("COURSE_START_METHOD", request.param)
    return request.param


def test_a_demo_prints_what_it_prints_when_forked(capsys, monkeypatch, forced_method):
    launch(collectives.demo_all_reduce, 4)
    spawned = capsys.readouterr().out.splitlines()
    plan = describe_plan(4, "gloo", forced_method)     # says why: COURSE_START_METHOD=...
    assert plan.endswith(f"(COURSE_START_METHOD={forced_method})")
    monkeypatch.setenv("COURSE_START_METHOD", "fork")
    launch(collectives.demo_all_reduce, 4)
    forked = capsys.readouterr().out.splitlines()
    assert spawned[0] == plan
    assert spawned[1:] == forked[1:] and len(spawned) == 5


def test_a_grader_runs_a_learner_function_defined_in_a_cell(capsys):
    offset = 1.0                               # a closure over a notebook variable

    def rank_sum():
        t = torch.tensor([dist.get_rank() + offset])
        dist.all_reduce(t)
        return t

    assert exercises.check_rank_sum(rank_sum)
    assert not exercises.check_rank_sum(lambda: 10.0)
    assert "rank 0: got 10, expected 3" in capsys.readouterr().out


def test_the_ranks_magic_sees_the_notebook_namespace():
    import threading

    def plus(a, b):                            # a function defined in a cell
        return a + b

    notebook = {"base": 1.0, "plus": plus, "lock": threading.Lock()}   # a lock cannot travel
    cell = "t = torch.tensor([plus(base, rank)]); dist.all_reduce(t); result = t.item()"
    assert ranks("3", cell, notebook) == [6.0, 6.0, 6.0]
    assert ranks("2", "result = 'lock' in dir()", notebook) == [False, False]


def test_a_strategy_trains_as_one_process_does():
    single = experiments.run("single", 1, steps=2)[0].losses
    sharded = experiments.run("zero3", 2, steps=2, quiet=True)
    for result in sharded:
        assert result.losses == pytest.approx(single, rel=LOSS_RTOL)
