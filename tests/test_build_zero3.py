"""Exercise 06.1 (build ZeRO-3): the course's FlatUnit (what Zero3 is made of) passes the
grader as it is; the notebook's scaffold, completed as its TODOs say (``solution("zero3")``), passes; planted mistakes fail
with the message that names them."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils.course.exercises import check_zero3, check_zero3_step_bytes, yours
from course_utils.course.exercises.nb12 import zero3_step_bytes
from course_utils.labs.grading import PASSED, first_problem
from course_utils.course.exercises.nb06 import units_on_rank, zero3_on_rank
from course_utils.impl.zero3 import FlatUnit
from course_utils.runtime.launch import launch
from toys import answer


Solution = answer("zero3")[0]["MyFlatUnit"]     # the notebook's MyFlatUnit with its four TODOs done


class NoPadding(Solution):
    def __init__(self, module):
        super().__init__(module)
        size = sum(p.numel() for p in self.params) // self.world
        self.shard = nn.Parameter(self.shard.detach()[:size].clone())


class KeepsChunk0(Solution):
    def __init__(self, module):
        super().__init__(module)
        self.gather()
        with torch.no_grad():
            self.shard.copy_(self.full[:self.shard.numel()])
        self.free()


def _all_reduce_then_slice(mine, flat):
    dist.all_reduce(flat)
    mine.copy_(flat.view(dist.get_world_size(), -1)[dist.get_rank()])


# the same answer, run with an all-reduce where it reduce-scatters (its own copy of the file's names)
_all_reducing = answer("zero3")[0]
_all_reducing["reduce_scatter_tensor"] = _all_reduce_then_slice
AllReduces = type("AllReduces", (_all_reducing["MyFlatUnit"],), {})


class NoDivide(Solution):
    def reduce_scatter(self):
        super().reduce_scatter()
        self.shard.grad *= self.world


class NeverFreesAfterForward(Solution):
    def forward(self, *args):
        self.gather()
        out = self.module(*args)
        out.register_hook(self._before_backward)
        return out


class NoRegather(Solution):
    def forward(self, *args):
        self.gather()
        out = self.module(*args)
        self.free()
        return out


class GathersTwice(Solution):
    def gather(self):
        super().gather()
        super().gather()


class KeepsFullGrads(Solution):
    def reduce_scatter(self):
        grads = [q.grad for q in self.params]
        super().reduce_scatter()
        for q, g in zip(self.params, grads):
            q.grad = g


PLANTED = {NoPadding: "the chunk was sized from the 35 unpadded elements",
           KeepsChunk0: "rank 1 keeps chunk 0 of the flat buffer, not chunk 1",
           AllReduces: "all-reduce(s) in backward: ZeRO-3 reduce-scatters each unit's gradient",
           NoDivide: "SUM over the 2 ranks: divide by the world size",
           NeverFreesAfterForward: "ZeRO-3 frees the full parameters after forward",
           NoRegather: "re-gather before the unit's backward",
           GathersTwice: "6 all-gathers in forward for 3 units, expected 3",
           KeepsFullGrads: "full .grads still held after backward"}


def _planted():
    return {cls.__name__: zero3_on_rank(cls) for cls in (Solution, *PLANTED)}


def test_the_course_zero3_passes(capsys):
    assert check_zero3(FlatUnit)
    out = capsys.readouterr().out
    for n, held in ((2, 240), (3, 160), (4, 120)):
        assert (f"{n} gloo ranks on CPU: right: per step 3 + 3 all-gathers (forward, backward) and 3 reduce-scatters "
                f"for 3 units; rank 0 holds 4·P/N = {held} B of params at rest (+ 28 B frozen)") in out


def test_the_completed_scaffold_passes_and_planted_mistakes_are_named():
    found = launch(_planted, 2, quiet=True)
    assert first_problem([per[Solution.__name__] for per in found]) is None
    for cls, message in PLANTED.items():
        first = first_problem([per[cls.__name__] for per in found])
        assert first and message in first[1], (cls.__name__, first)


def test_a_non_class_is_refused(capsys):
    assert not check_zero3("MyFlatUnit")
    assert "check_zero3 takes your class" in capsys.readouterr().out


def test_the_learners_unit_is_measured_on_the_course_model(capsys):
    """Notebook 06 §5: once a unit passed check_zero3, ``yours`` hands it to ``units_on_rank``,
    which measures it on the whole course model (the blocks and the root its units); the reference gives the same measurement,
    and a unit that never frees after forward shows every block gathered at once."""
    PASSED.clear()
    PASSED["zero3"] = Solution
    try:
        assert yours("zero3", Solution) is Solution
    finally:
        PASSED.clear()
    root, block = 4 * 6_750, 4 * 30_650                     # fp32 bytes, even: no padding on 2
    model = root + 4 * block
    mine, ref = (launch(units_on_rank, 2, cls, quiet=True) for cls in (Solution, FlatUnit))
    for m, r in zip(mine, ref):
        assert m["at_rest"] == m["at_rest_after"] == r["at_rest"] == model // 2
        assert m["calls"] == r["calls"] == {"all_reduce": 0, "reduce_scatter": 5, "all_gather": 9}  # 2L + 1
        assert m["sent"] == r["sent"] and m["peak_gathered"] == root + block and m["after_step"] == 0
        assert max(abs(a - b) for a, b in zip(m["losses"], m["ref_losses"])) < 1e-6
    keeps = launch(units_on_rank, 2, NeverFreesAfterForward, quiet=True)[0]
    assert keeps["peak_gathered"] == model and keeps["at_rest_after"] == model // 2


def _units_loop(rank, world_size, cls=Solution, steps=3):
    """An ordinary loop (SGD with momentum, a scheduler, clipping) on the whole model made of ``cls``'s units,
    then the full parameters; and what ``wrap`` says to a model it cannot shard that way."""
    from course_utils.harness import experiments as ex
    from course_utils.harness.model import SyntheticData, build_model
    model = build_model(seed=0)
    if world_size > 1:
        # the group's own lr, not the optimizer's default, must reach the shards' optimizer
        make = lambda ps: torch.optim.SGD([{"params": list(ps), "lr": 0.1}], lr=0.5, momentum=0.9)
        model, opt = ex.wrap("zero3", model, make, impl=cls)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (1 + k))
    data, norms = SyntheticData(global_batch=ex.GLOBAL_BATCH, seed=0), []
    for step in range(steps):
        model(*data.shard(step, rank, world_size)).backward()
        norms.append(float(ex.clip_grad_norm_(model, 0.5)))
        opt.step()
        sched.step()
        opt.zero_grad()
    errors = []
    tied = build_model(seed=0)
    tied.blocks[1].attn = tied.blocks[0].attn
    two = lambda ps: torch.optim.AdamW([{"params": list(ps)[:2], "lr": 1.0}, {"params": list(ps)[2:]}])
    for bad in (lambda: ex.wrap("zero3", tied, torch.optim.AdamW, impl=cls),
                lambda: ex.wrap("zero3", build_model(seed=0), two, impl=cls)):
        try:
            bad()
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    return {"norms": norms, "params": ex.full_parameters(model), "errors": errors}


def test_the_whole_model_from_the_learners_unit_behaves_like_torch():
    """``wrap("zero3", impl=MyFlatUnit)``: SGD, an LR scheduler and clipping in an ordinary
    loop give one process's norms and parameters (3 ranks: every unit padded); a tied weight
    across blocks and two parameter groups are refused by name."""
    one = launch(_units_loop, 1, quiet=True)[0]
    for got in launch(_units_loop, 3, quiet=True):
        assert got["norms"] == pytest.approx(one["norms"], rel=1e-5)
        assert got["params"].keys() == one["params"].keys()
        for name, t in one["params"].items():
            torch.testing.assert_close(got["params"][name], t, rtol=0, atol=1e-6, msg=name)
        assert "shares a trainable parameter with another unit" in got["errors"][0]
        assert "make_optimizer must build a single parameter group" in got["errors"][1]


def test_zero3_step_bytes_is_the_ledgers_count(capsys):
    """Appendix 12's exercise: the reference is the ledger's bytes of notebook 06 (5 steps on 2
    ranks: 2,519,500 B all-gathered + 1,293,500 B reduce-scattered), and a wrong count fails."""
    assert zero3_step_bytes([6750] + [30650] * 4, 2) * 5 == 2_519_500 + 1_293_500
    assert zero3_step_bytes([6750] + [30650] * 4, 2, reshard_root=True) == 776_100
    assert check_zero3_step_bytes(zero3_step_bytes)
    assert not check_zero3_step_bytes(lambda unit_numels, world, reshard_root=False: 0.0)
    assert "0 of 5 cases right" in capsys.readouterr().out
