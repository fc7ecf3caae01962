"""The builds as the spine: ``yours`` hands the cells after a build the learner's class once it
passed its check (else the reference, saying so), ``run(..., impl=...)`` measures it, and
``solution`` prints the skeleton filled in on demand. The classes are the answers in
``course_utils/course/solutions/``, the skeletons filled in as a learner would, not subclasses
of the course's."""
import pytest

from toys import answer

from course_utils.course.exercises import BUILDS, check_ddp, solution, yours
from course_utils.course.exercises.solutions import SOLUTIONS
from course_utils.harness import experiments
from course_utils.labs.grading import PASSED
from course_utils.impl.ddp import DataParallel
from course_utils.impl.zero import Zero1

MyDDP = answer("ddp")[0]["MyDDP"]
MyZero1 = answer("zero1")[0]["MyZero1"]
MyZero2 = answer("zero2")[0]["MyZero2"]


@pytest.fixture(autouse=True)
def _fresh_registry():
    PASSED.clear()
    yield
    PASSED.clear()


def test_an_unchecked_class_runs_the_reference(capsys):
    assert yours("zero1", MyZero1) is Zero1
    assert yours("ddp", None) is DataParallel
    out = capsys.readouterr().out
    assert "your MyZero1 has not passed check_zero1 yet: running the course's Zero1" in out
    assert "your MyDDP has not passed check_ddp yet: running the course's DataParallel" in out


def test_a_class_that_passed_is_the_one_measured(capsys):
    assert check_ddp(MyDDP)
    assert yours("ddp", MyDDP) is MyDDP
    assert "running your MyDDP (it passed check_ddp)" in capsys.readouterr().out
    mine = experiments.run("ddp", 2, steps=2, impl=MyDDP, quiet=True)
    ref = experiments.run("ddp", 2, steps=2, quiet=True)
    single = experiments.run("single", 1, steps=2)[0]
    assert max(abs(a - b) for a, b in zip(mine[0].losses, single.losses)) < 1e-5
    assert mine[0].comm_bytes == ref[0].comm_bytes
    assert mine[0].state_bytes["params"] == ref[0].state_bytes["params"]


def test_a_redefined_class_must_pass_again(capsys):
    class Other(MyDDP):
        pass
    PASSED["ddp"] = MyDDP
    assert yours("ddp", Other) is DataParallel


def test_learners_zero1_measures_its_own_bytes():
    mine = experiments.run("zero1", 2, steps=2, impl=MyZero1, quiet=True)
    ref = experiments.run("zero1", 2, steps=2, quiet=True)
    assert mine[0].losses == pytest.approx(ref[0].losses, rel=1e-6)
    assert mine[0].comm_bytes == ref[0].comm_bytes
    assert mine[0].state_bytes["optimizer"] == ref[0].state_bytes["optimizer"]
    assert mine[0].param_digest == mine[1].param_digest
    # 04 §6: the skeleton's MyZero1 keeps the shard's gradient apart, 4·P/N bytes more than Zero1's
    psi, shard = 129_350, 129_350 // 2
    assert ref[0].state_bytes["grads"] == 4 * psi
    assert mine[0].state_bytes["grads"] == 4 * psi + 4 * shard == 776_100


def test_impl_runs_as_it_is():
    with pytest.raises(ValueError, match="impl=MyZero1 runs your class as it is: drop variant"):
        experiments.run("zero1", 2, steps=1, impl=MyZero1, variant="allreduce", quiet=True)
    with pytest.raises(TypeError, match="impl must be a class"):
        experiments.run("ddp", 2, steps=1, impl="MyDDP", quiet=True)


@pytest.mark.parametrize("name", list(BUILDS))
def test_solution_prints_the_skeleton_filled_in(name, capsys):
    """The printed answer has the skeleton's class and methods and ends with its check."""
    import json
    import re

    from course_utils.course.badges import ROOT
    solution(name)
    out = capsys.readouterr().out
    learner = BUILDS[name][0]
    assert out == (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8")
    assert out.rstrip().endswith(f"check_{name}({learner})")
    from test_build_specs import NOTEBOOK
    notebook = next((ROOT / "notebooks").glob(f"{NOTEBOOK[name]}_*.ipynb"))
    skeleton = next("".join(c["source"]) for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]
                    if f"class {learner}(" in "".join(c["source"]))
    given, written = (re.findall(r"def (\w+)\(", text) for text in (skeleton, out))
    assert [m for m in written if m in given] == given               # the skeleton's methods, in order
    assert set(written) - set(given) <= {"_launch", "_before_backward", "_wait", "_sum_gradients"}   # plus helpers


def test_solution_names_the_exercises():
    with pytest.raises(ValueError, match="known exercises: 00.1, .*, ddp, zero1, mixed, zero2, zero3"):
        solution("zero4")


class FinishesInStep(MyZero2):
    """The design that cannot accumulate: what is left is sent from step(), once."""

    def _on_grad(self, p):
        self.ready.add(id(p))
        while self.next < len(self.buckets) and all(id(q) in self.ready for q in self.buckets[self.next].params):
            self._launch()

    def step(self, closure=None):
        self._finish()
        return super().step(closure)


def test_learners_zero2_passes_and_accumulates(capsys):
    from course_utils.course.exercises import check_zero2
    assert check_zero2(MyZero2)
    assert not check_zero2(FinishesInStep)
    assert "the step's second backward (gradient accumulation) sent nothing" in capsys.readouterr().out
    mine = experiments.run("zero2", 2, steps=2, impl=MyZero2, quiet=True)
    ref = experiments.run("zero2", 2, steps=2, quiet=True)
    assert mine[0].losses == pytest.approx(ref[0].losses, rel=1e-6)
    assert mine[0].comm_calls == ref[0].comm_calls
    assert mine[0].state_bytes["grads"] == ref[0].state_bytes["grads"]


def test_versus_hides_the_measurement_until_there_is_a_prediction(capsys):
    from course_utils.course.exercises import versus
    versus(None, 258_708, "optimizer bytes")
    versus(258_700, 258_708, "optimizer bytes")
    versus(129_354, 258_708, "optimizer bytes")
    none, close, off = capsys.readouterr().out.splitlines()
    assert "258" not in none and "predict first" in none
    assert close.endswith("measured 258,708: right") and off.endswith("off by 50%")


def test_versus_in_a_notebook_keeps_the_measurement_behind_a_closed_reveal(monkeypatch):
    """In a kernel the prompt is the text; the HTML (what GitHub and the book show a reader of the
    saved notebook) has the measurement behind a <details> that starts closed."""
    import IPython
    import IPython.display

    from course_utils.course.exercises import versus
    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Shell", (), {"kernel": object()})())
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw: shown.append(bundle))
    versus(None, 258_708, "optimizer bytes")
    (bundle,) = shown
    assert "258" not in bundle["text/plain"] and "predict first" in bundle["text/plain"]
    html = bundle["text/html"]
    assert "<details>" in html and "<details open" not in html
    assert html.index("predict first") < html.index("<details>") < html.index("measured 258,708")


def test_once_predicted_prints_the_table_only_after_every_prediction(capsys):
    from course_utils.course.exercises import once_predicted
    once_predicted("row 1\nrow 2", 250, None, what="the table")
    once_predicted("row 1\nrow 2", 250, 200, what="the table")
    hidden, *shown = capsys.readouterr().out.splitlines()
    assert hidden == "the table: shown once you have predicted" and shown == ["row 1", "row 2"]


def _closure_on_rank(kind):
    import torch
    from course_utils.harness.model import SyntheticData, build_model
    import torch.distributed as dist
    cls = answer(kind)[0]["MyZero1" if kind == "zero1" else "MyMixedZero1"]
    model = build_model(seed=0)          # fp32; MyMixedZero1 makes its parameters bf16 views itself
    opt = cls(model.parameters(), torch.optim.AdamW, lr=1e-3)
    x, y = SyntheticData(global_batch=12, seed=0).shard(0, dist.get_rank(), dist.get_world_size())
    calls = []

    def closure():
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        calls.append(loss.item())
        return loss

    loss = opt.step(closure)
    return calls, loss.item()


@pytest.mark.parametrize("kind", ["zero1", "mixed"])
def test_the_zero1_answers_take_a_closure_as_torch_optimizers_do(kind):
    """step(closure) calls it once under autograd and returns its loss, as torch.optim's do: the
    answers learners copy must not drop it silently."""
    from course_utils.runtime.launch import launch
    for calls, loss in launch(_closure_on_rank, 2, kind, quiet=True):
        assert len(calls) == 1 and calls[0] == loss
