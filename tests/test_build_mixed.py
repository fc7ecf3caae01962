"""Exercise 04.2 (optional), ZeRO-1 in mixed precision: the answer passes ``check_mixed`` with 12·P/N + 4
optimizer bytes per rank (K = 12, measured by ``state_bytes``), and the typical mistakes, one-line edits
of the answer, are each named."""
import pytest
from toys import answer

from course_utils.course.exercises import check_mixed
from course_utils.course.exercises.nb04 import mixed_on_rank
from course_utils.course.exercises.solutions import SOLUTIONS
from course_utils.labs.grading import first_problem
from course_utils.runtime.launch import launch

SOURCE = (SOLUTIONS / "mixed.py").read_text(encoding="utf-8")

#: a one-line edit of the answer -> what the grader must say
MISTAKES = {
    "rounded master": (("            master = nn.Parameter(full[lo:hi].clone())\n            flat = full.to(torch.bfloat16)\n",
                        "            flat = full.to(torch.bfloat16)\n            master = nn.Parameter(flat[lo:hi].float())\n"),
                       "the masters hold the weights rounded to bf16"),
    "bf16 master": (("            master = nn.Parameter(full[lo:hi].clone())\n",
                     "            master = nn.Parameter(full[lo:hi].clone().bfloat16())\n"),
                    "expected one fp32 master per group"),
    "fp32 parameters": (("            flat = full.to(torch.bfloat16)\n", "            flat = full\n"),
                        "must be views of a bf16 flat buffer"),
    "no average": (("mine.float() / self.n", "mine.float()"), "the SUM over the 3 ranks: divide by N"),
    "not written back": (('            f["flat"][f["lo"]:f["hi"]] = f["master"]\n', ""),
                         "do not show its masters' update"),
    "not gathered": (('            all_gather_into_tensor(f["flat"], f["flat"][f["lo"]:f["hi"]])\n', ""),
                     "the ranks' parameters differ"),
}


def _variant(old: str, new: str):
    assert SOURCE.count(old) == 1, old
    namespace: dict = {}
    exec(compile(SOURCE.replace(old, new).rsplit("check_mixed(", 1)[0], "variant.py", "exec"), namespace)
    return namespace["MyMixedZero1"]


def _graded(rank, world_size):
    return {name: mixed_on_rank(_variant(*edit)) for name, (edit, _) in MISTAKES.items()}


def test_the_answer_passes_with_k_12(capsys):
    assert check_mixed(answer("mixed")[0]["MyMixedZero1"])
    out = capsys.readouterr().out
    assert "2 gloo ranks on CPU: right: bf16 parameters (258,900 B)" in out
    assert "optimizer 12·P/N + 4 per shard = 775,508 B on rank 0 (K = 12)" in out      # 12 x 64,625 + 8
    assert 12 * 64_625 + 2 * 4 == 775_508


def test_the_typical_mistakes_are_named():
    found = launch(_graded, 3, quiet=True, timeout_s=120)
    for name, (_, message) in MISTAKES.items():
        first = first_problem([per[name] for per in found])
        assert first and message in first[1], (name, first)


def test_the_skeleton_is_refused_by_name(capsys):
    from course_utils.course.exercises.solutions import skeleton
    namespace: dict = {}
    exec(skeleton("mixed").rsplit("check_mixed(", 1)[0], namespace)
    assert not check_mixed(namespace["MyMixedZero1"])
    assert "__init__ did not build optimizer_class once" in capsys.readouterr().out
