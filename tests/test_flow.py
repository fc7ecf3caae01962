"""Prerequisite order: no notebook leans on a key idea that a later notebook teaches.

The rule, for each key term below (a regular expression, case-insensitive) and the notebook
that teaches it: no cell of an *earlier* notebook mentions the term (in markdown, in code,
or in a code cell's saved text output), and no question of an earlier notebook's quiz does
(prompt, options or explanation), except

1. the notebook's first cell (title, "You will learn", "Prerequisites", "Runs in");
2. notebook 00's section 1, the course map and roadmap (from ``## 1.`` to the next ``## ``);
3. a cell or quiz question that itself points forward to where the term is taught: it names
   that notebook or a later one, as in "(notebook 06)", "in notebook 08", "notebooks 04 and
   06", "notebooks 06-07";
4. a code cell whose markdown cell just above it points forward that way (the prose
   introduces what the code then shows).

A quiz's printed form (the ``quiz.show`` output) is not read: the quiz bank is checked
instead, question by question, so a stale output cannot hide or invent a violation.

The terms: reduce-scatter (taught in 01); the names ZeRO-2 and ZeRO-3, which 03 introduces
with each stage's memory (00's map previews them); how ZeRO-3 communicates (its name in the
same sentence as a gather or its 1.5x traffic) and prefetching, taught in 06; hybrid
sharding (HSDP, ``HYBRID_SHARD``), taught in 08.

Fast: it reads the notebooks' JSON and builds the quizzes, nothing runs.
"""
import json
import re

import pytest

from course_utils.course import paths as _course
from course_utils.course import quiz
from course_utils.course.badges import ROOT
from course_utils.course.quizbank import QUIZZES

ZERO3 = r"\bzero[- ]?3\b"
TERMS = [
    # name, pattern(s) that must all match the same cell, notebook that teaches it
    ("reduce-scatter", [r"reduce[-_ ]scatter"], "01"),
    ("ZeRO-2", [r"\bzero[- ]?2\b"], "03"),
    ("ZeRO-3", [ZERO3], "03"),
    ("ZeRO-3's gathers and traffic", [ZERO3, r"\b(all[-_ ])?gather(s|ed|ing)?\b|1\.5\s*(x|×)"], "06"),
    ("prefetch", [r"prefetch"], "06"),
    ("HSDP", [r"\bhsdp\b|hybrid[ _-]?shard"], "08"),
]
FORWARD = re.compile(r"notebooks?\s+(\d\d(?:\s*(?:,|and|or|-|–|to)\s*\d\d)*)", re.IGNORECASE)
NOTEBOOKS = [name for name, _, _ in _course.NOTEBOOKS if (ROOT / "notebooks" / name).exists()]


def _text(cell) -> str:
    text = "".join(cell["source"])
    for out in cell.get("outputs", []):
        text += "\n" + "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
    return text


def _points_forward(text: str, teacher: str) -> bool:
    return any(int(n) >= int(teacher) for m in FORWARD.finditer(text) for n in re.findall(r"\d\d", m.group(1)))


SENTENCE = re.compile(r"(?<=[.!?])\s+|\n\s*\n|\n\s*[-*] ")


def _use(text: str, patterns) -> str | None:
    """The first sentence (or list item, or paragraph of output) where all the patterns
    match, or None."""
    return next((part for part in SENTENCE.split(text)
                 if all(re.search(p, part, re.IGNORECASE) for p in patterns)), None)


def _uses(text: str, patterns) -> bool:
    return _use(text, patterns) is not None


def _exempt_cells(number: str, cells) -> set:
    exempt = {0}
    if number == "00":
        inside = False
        for i, cell in enumerate(cells):
            src = "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
            if re.search(r"^## ", src, re.MULTILINE):
                inside = bool(re.search(r"^## 1\. ", src, re.MULTILINE))
            if inside:
                exempt.add(i)
    return exempt


def violations(name, patterns, teacher):
    found = []
    for nb in NOTEBOOKS:
        number = nb[:2]
        if number >= teacher:
            continue
        cells = json.loads((ROOT / "notebooks" / nb).read_text(encoding="utf-8"))["cells"]
        exempt = _exempt_cells(number, cells)
        for i, cell in enumerate(cells):
            if i in exempt or "quiz.show(" in "".join(cell["source"]):
                continue
            text = _text(cell)
            if not _uses(text, patterns) or _points_forward(text, teacher):
                continue
            above = cells[i - 1] if i else None
            if (cell["cell_type"] == "code" and above is not None and above["cell_type"] == "markdown"
                    and _points_forward("".join(above["source"]), teacher)):
                continue
            found.append(f"{number} [{cell['cell_type'][:2]} {i}]: {_use(text, patterns)[:160]!r}")
        if number in QUIZZES:
            for q_number, question in enumerate(quiz.get(number).questions, 1):
                text = question.text() + "\n" + question.explanation
                if _uses(text, patterns) and not _points_forward(text, teacher):
                    found.append(f"{number} quiz Q{q_number}: {question.prompt[:90]!r}")
    return found


@pytest.mark.parametrize("name, patterns, teacher", TERMS, ids=[t[0] for t in TERMS])
def test_no_notebook_uses_a_term_before_it_is_taught(name, patterns, teacher):
    found = violations(name, patterns, teacher)
    assert not found, (f"'{name}' is taught in notebook {teacher}; earlier notebooks use it without "
                       f"pointing forward (add e.g. '(notebook {teacher})' or move it):\n" + "\n".join(found))


@pytest.mark.parametrize("name, patterns, teacher", TERMS, ids=[t[0] for t in TERMS])
def test_the_teaching_notebook_teaches_the_term(name, patterns, teacher):
    nb = next(n for n in NOTEBOOKS if n.startswith(teacher))
    cells = json.loads((ROOT / "notebooks" / nb).read_text(encoding="utf-8"))["cells"]
    assert any(_uses(_text(c), patterns) for c in cells[1:]), f"notebook {teacher} never mentions '{name}'"


def test_forward_references_are_recognised():
    assert _points_forward("ZeRO-3 and FSDP (notebooks 06-07) use it", "06")
    assert _points_forward("measured in notebooks 04 and 06", "06")
    assert _points_forward("hybrid sharding, in notebook 08", "08")
    assert not _points_forward("as notebook 03 showed", "06")
    assert not _points_forward("no reference here", "01")


GLOSSARY_TERMS = ["rank", "world size", "process group", "collective", "all-reduce", "NCCL", "gloo", "NVLink",
                  "InfiniBand", "NIC", "torchrun", "DDP", "bucket", "model states", "optimizer states",
                  "mixed precision", "master weights", "the course GPT", "shard", "ZeRO", "FSDP"]


def test_glossary_defines_the_words_used_before_they_are_taught():
    """00 §1 opens with a glossary: every key term is defined there (in bold) before any other cell
    of the course uses it (the title cell and the Colab cell aside)."""
    cells = json.loads((ROOT / "notebooks" / NOTEBOOKS[0]).read_text(encoding="utf-8"))["cells"]
    where = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and "".join(c["source"]).startswith("## 1."))
    glossary = "".join(cells[where]["source"])
    for term in GLOSSARY_TERMS:
        assert re.search(rf"\*\*{re.escape(term)}\*\*", glossary, re.IGNORECASE), f"00's glossary lacks **{term}**"
    assert where <= 2, "the glossary must come before any other cell uses its terms"
