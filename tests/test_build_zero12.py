"""Exercises 04.1 (build ZeRO-1) and 05.1 (build ZeRO-2): the course's Zero1 and Zero2
pass the graders; planted mistakes, each a subclass of it that breaks one thing, fail
with the message that names them."""
import contextlib
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils.course.exercises import check_zero1, check_zero2
from course_utils.labs.grading import first_problem
from course_utils.course.exercises.nb04 import zero_on_rank
from course_utils.course.exercises.nb05 import ZERO2_BUCKETS
from course_utils.impl import zero, zero1, zero2
from course_utils.impl.zero import AllReduceGradients, SendAfterBackward, Zero1, Zero2
from course_utils.runtime.launch import launch


class _Patched:
    """Builds the reference with some of impl.zero1's and zero2's helpers replaced (``PATCHES``)."""

    PATCHES: dict = {}

    def __init__(self, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            for name, fake in self.PATCHES.items():
                for module in (zero1, zero2):          # where the reference looks each name up
                    if hasattr(module, name):
                        stack.enter_context(mock.patch.object(module, name, fake))
            super().__init__(*args, **kwargs)


def _unpadded(tensors, world_size, *, dtype=None):
    return torch.cat([t.reshape(-1) for t in tensors]).to(dtype)


def _floor_bounds(numel, world_size, rank):
    size = numel // world_size
    return rank * size, (rank + 1) * size


class _NoPadding(_Patched):
    PATCHES = {"flatten_and_pad": _unpadded, "shard_bounds": _floor_bounds}


class _NoDivide:
    """Sums the gradients and forgets to divide by N."""

    def reduce_gradients(self):
        done = self._reduced
        super().reduce_gradients()
        for b in [] if done else self.buckets:
            b.shard_grad.mul_(self.n)


# ------------------------------------------------------------------------------ ZeRO-1
class NoDivide1(_NoDivide, Zero1):
    pass


class NoPadding1(_NoPadding, Zero1):
    pass


class FullState(Zero1):
    def _make_bucket(self, params):
        bucket = super()._make_bucket(params)
        bucket.shard = nn.Parameter(bucket.flat)
        bucket.shard.grad = bucket.flat_grads
        return bucket


class _Done:
    def wait(self):
        pass


class NoAllGather(Zero1):
    def step(self, closure=None):
        with mock.patch.object(zero1, "all_gather_into_tensor", lambda *a, **k: _Done()):
            return super().step(closure)


class IgnoresGroups(Zero1):
    @staticmethod
    def _hyper(group):
        return {}


class AllReduces(AllReduceGradients, Zero1):
    """All-reduces the gradients and keeps a slice: right numbers, twice the bytes."""


PLANTED_1 = {NoDivide1: "SUM over the 3 ranks: divide by the world size",
             NoPadding1: "is not padded to a multiple of 3",
             FullState: "holds 3× the state: the inner optimizer must see only this rank's shard",
             NoAllGather: "the other ranks' slices were not all-gathered",
             IgnoresGroups: "one inner group per parameter group",
             AllReduces: "all-reduces per step"}


# ------------------------------------------------------------------------------ ZeRO-2
class NoDivide2(_NoDivide, Zero2):
    pass


class NoPadding2(_NoPadding, Zero2):
    pass


class KeepsGrads(Zero2):
    def _launch(self):
        bucket = self.buckets[self.next]
        kept = [p.grad for p in bucket.params]
        super()._launch()
        for p, g in zip(bucket.params, kept):
            p.grad = g


class ReducesInStep(SendAfterBackward, Zero2):
    """The hooks only note the gradients; every reduce-scatter waits for step()."""


PLANTED_2 = {NoDivide2: "SUM over the 3 ranks: divide by the world size",
             NoPadding2: "is not padded to a multiple of 3",
             KeepsGrads: "full gradients not freed",
             ReducesInStep: "reduce-scatter from the hooks, during backward, not in step()"}


def _planted(rank, world_size):
    found = {cls.__name__: zero_on_rank(cls, (None,), 1, steps=2) for cls in PLANTED_1}
    found.update({cls.__name__: zero_on_rank(cls, ZERO2_BUCKETS, 2, steps=2) for cls in PLANTED_2})
    return found


PASSES = {"zero1": (check_zero1, Zero1, ["right: AdamW state 1/N",
                                                  "8·P/N + 8 = 344,680 B, one process 1,034,264 B",
                                                  "per step 2 reduce-scatters + 2 all-gathers"]),
          "zero2": (check_zero2, Zero2, ["right: reduce-scatters during backward [66, 2]",
                                               "shard gradients 4·P/N = 172,336 B",
                                               "(ZeRO-1 keeps 4·P = 517,008 B)"])}


@pytest.mark.parametrize("stage", PASSES)
def test_the_course_reference_passes(stage, capsys):
    check, reference, lines = PASSES[stage]
    assert check(reference)
    out = capsys.readouterr().out
    for n in (2, 3, 4):
        assert f"{n} gloo ranks on CPU: {lines[0]}" in out
    assert all(line in out for line in lines[1:])          # the numbers of 3 ranks


def test_planted_mistakes_are_named():
    found = launch(_planted, 3, quiet=True, timeout_s=240)
    for cls, message in {**PLANTED_1, **PLANTED_2}.items():
        first = first_problem([per[cls.__name__] for per in found])
        assert first and message in first[1], (cls.__name__, first)


def test_a_non_class_is_refused(capsys):
    assert not check_zero1(lambda params, cls: None)
    assert not check_zero2(3)
    out = capsys.readouterr().out
    assert "launch:" not in out                       # refused before any rank starts
    assert "check_zero1 takes your class (e.g. check_zero1(MyZero1))" in out
    assert "check_zero2 takes your class (e.g. check_zero2(MyZero2))" in out


def _solution_source() -> str:
    from course_utils.course.exercises.solutions import SOLUTIONS
    return (SOLUTIONS / "zero1.py").read_text().replace("\ncheck_zero1(MyZero1)\n", "\n")


def _solution_zero1(only_first_group: bool):
    """The answer file's MyZero1, or the same with ``self.param_groups[:1]``: a learner's first stage,
    which shards and steps only the first group."""
    src = _solution_source()
    if only_first_group:
        assert "for group in self.param_groups:" in src
        src = src.replace("for group in self.param_groups:", "for group in self.param_groups[:1]:")
    space: dict = {}
    exec(compile(src, "zero1.py", "exec"), space)
    return space["MyZero1"]


def test_the_one_group_stage_passes_a_first_group_class_and_the_exercise_does_not(capsys):
    """04's exercise: one group right, then three groups right or refused at construction. A class
    that handles only ``param_groups[0]`` silently passes the one-group run and fails the exercise; the
    same class raising for more than one group passes it (it fails loudly), and ``yours`` takes it."""
    from course_utils.course.exercises import yours
    from course_utils.course.exercises.nb04 import ONE_GROUP
    from course_utils.labs.grading import PASSED
    first = _solution_zero1(only_first_group=True)
    saved = dict(PASSED)                                       # other tests' verdicts, put back below
    try:
        PASSED.pop("zero1", None)
        assert check_zero1(first, one_group=True) and ONE_GROUP in PASSED and "zero1" not in PASSED
        out = capsys.readouterr().out
        assert "2 gloo ranks on CPU: right: AdamW state 1/N" in out
        assert not check_zero1(first)                          # three groups: groups 1 and 2 never step
        out = capsys.readouterr().out
        assert "right on one parameter group; with three (one of them all frozen)" in out
        assert "is in no flat buffer" in out and "raise an error in __init__" in out
        assert "zero1" not in PASSED and yours("zero1", first) is not first

        class OneGroup(first):
            def __init__(self, params, optimizer_class, **defaults):
                params = list(params)
                if len(params) > 1 and isinstance(params[0], dict):
                    raise ValueError("MyZero1 takes one parameter group")
                super().__init__(params, optimizer_class, **defaults)

        assert check_zero1(OneGroup)                           # refuses three groups loudly: allowed
        out = capsys.readouterr().out
        assert "several parameter groups refused at construction (ValueError: MyZero1 takes one parameter group)" in out
        assert yours("zero1", OneGroup) is OneGroup

        class RefusesOnRankOne(first):                         # a refusal must be every rank's, or none's
            def __init__(self, params, optimizer_class, **defaults):
                params = list(params)
                if len(params) > 1 and isinstance(params[0], dict) and dist.get_rank() == 1:
                    raise ValueError("rank 1 takes one parameter group")
                super().__init__(params, optimizer_class, **defaults)

        assert not check_zero1(RefusesOnRankOne, world_sizes=(2,))
        out = capsys.readouterr().out
        assert "raised ValueError: rank 1 takes one parameter group on this rank, not on every rank" in out

        src = (_solution_source().replace('{**hyper(group), "params": [shard]}', '{**hyper(self.param_groups[0]), "params": [shard]}')
               .replace("            if not params:                           # a group of frozen parameters: nothing to shard\n"
                        "                continue\n", ""))
        assert "if not params" not in src and "hyper(self.param_groups[0])" in src
        space: dict = {}
        exec(compile(src, "zero1.py", "exec"), space)             # group 0's weight decay for every group, and
        assert not check_zero1(space["MyZero1"], world_sizes=(2,))  # a crash on the all-frozen group: not a refusal
        out = capsys.readouterr().out
        assert "right on one parameter group; with three (one of them all frozen)" in out
        assert check_zero1(_solution_zero1(only_first_group=False), one_group=True)   # the answer passes both
    finally:
        PASSED.clear()
        PASSED.update(saved)
