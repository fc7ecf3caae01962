"""Quiz explanations quote the numbers the notebooks print (issue 27, item 5).

A question whose explanation quotes a notebook ("section 5 printed 2,587,000", "the calculator's
17 -> 25") names it: ``printed="05"``. In every sentence of an explanation that says printed,
prints, measured or the calculator's, each number with >= 3 significant digits (or a thousands
separator) must be a value that notebook's saved text outputs hold (compared as values, so 517,400
matches 517400 but not 517,401), and each "a -> b" must appear in that order on one output line.
Fast: it reads the notebooks' JSON and builds the quizzes, nothing runs.
"""
from __future__ import annotations

import json
import re
from functools import cache

import pytest

from course_utils.course import quiz
from course_utils.course.badges import ROOT
from course_utils.course.quizbank import QUIZZES

NUMBER = r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,])\d+(?:\.\d+)?(?![\w])"
NUM = re.compile(NUMBER)
ARROW = re.compile(rf"({NUMBER})\s*->\s*({NUMBER})")
QUOTES = re.compile(r"\b(printed|prints|measured|measures)\b|calculator's", re.IGNORECASE)
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def _value(token: str) -> float:
    return float(token.replace(",", ""))


def _checked(token: str) -> bool:
    """>= 3 significant digits, or a thousands separator."""
    return "," in token or len(re.sub(r"^[0.]+", "", token.replace(".", "")).rstrip()) >= 3


@cache
def saved_lines(number: str) -> tuple[str, ...]:
    """The saved text outputs of notebook ``number``, line by line; quiz cells left out (they
    print the quiz itself)."""
    path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    lines = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code" or "quiz." in "".join(cell["source"]):
            continue
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            lines += text.splitlines()
    return tuple(lines)


def quoted_sentences(text: str) -> list[str]:
    return [s for s in SENTENCE.split(text) if QUOTES.search(s)]


def mismatches(text: str, number: str) -> list[str]:
    """What ``text`` quotes from notebook ``number`` that its outputs do not hold."""
    lines = saved_lines(number)
    values = {_value(t) for line in lines for t in NUM.findall(line)}
    bad = []
    for sentence in quoted_sentences(text):
        for token in NUM.findall(sentence):
            if _checked(token) and _value(token) not in values:
                bad.append(f"{token} (in {sentence!r})")
        for a, b in ARROW.findall(sentence):
            if not any(_in_order(line, _value(a), _value(b)) for line in lines):
                bad.append(f"{a} -> {b} on no output line (in {sentence!r})")
    return bad


def _in_order(line: str, a: float, b: float) -> bool:
    vals = [_value(t) for t in NUM.findall(line)]
    return a in vals and b in vals[vals.index(a) + 1:]


def _questions():
    return [(key, i, q) for key in sorted(QUIZZES) for i, q in enumerate(quiz.get(key).questions, 1)]


@pytest.mark.parametrize("key, i, q", _questions(), ids=[f"{k}-Q{i}" for k, i, _ in _questions()])
def test_quoted_numbers_are_the_printed_ones(key, i, q):
    quoted = [t for s in quoted_sentences(q.explanation)
              for t in NUM.findall(s) + ARROW.findall(s) if isinstance(t, tuple) or _checked(t)]
    if q.printed is None:
        assert not quoted, (f"quiz {key} Q{i} quotes {quoted} from a notebook: say which one "
                            "(printed='NN') so that they are checked")
        return
    assert quoted, f"quiz {key} Q{i} says printed={q.printed!r} but quotes no number"
    assert not mismatches(q.explanation, q.printed), (key, i, mismatches(q.explanation, q.printed))


def test_the_check_catches_a_real_mismatch():
    """The old quiz 05 Q6 said the calculator gives 15 -> 22; appendix 09 prints 17 -> 25."""
    assert mismatches("about 8 more sequences fit per GPU: the calculator's 15 -> 22 in 80 GB.", "09")
    assert not mismatches("Appendix 09 §5's calculator printed 17 -> 25 on 8 GPUs of 80 GB.", "09")
    assert not mismatches("Section 6 printed 1,293,500 for 4 micro-batches.", "05")
    assert mismatches("Section 6 printed 1,293,501 for 4 micro-batches.", "05")
    assert mismatches("Section 6 printed 1,293.5 for 4 micro-batches.", "05")
    assert not mismatches("It needs 1,293,501 bytes.", "05")     # not a quote: not checked
