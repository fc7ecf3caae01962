"""The learner's first pass through 00-08 skips the sections titled "Optional:" (00 and the README
say so). That holds only if nothing on the path needs them: no required cell, no quiz question and
no later notebook's required cell may send the learner to an optional section, except in a line
that itself says "optional"."""
import json
import re

import pytest

from course_utils.course import paths, quizbank
from course_utils.course.badges import ROOT

CORE = [name for name, _, _ in paths.NOTEBOOKS if name not in paths.APPENDICES]
HEADING = re.compile(r"^(#{2,3}) (\d+(?:\.\d+)?)\.? (Optional: )?", re.M)
SKIP_LINE = "*Skip it on a first pass: nothing later in 00-08 builds on it.*"


def _sections(name: str) -> list[tuple[str, bool, str]]:
    """(section number, optional, cell source) for every cell of a core notebook, in order; a
    subsection inherits its section's optional."""
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    out, number, optional, parent_optional = [], "", False, False
    for cell in cells:
        source = "".join(cell["source"])
        m = HEADING.match(source) if cell["cell_type"] == "markdown" else None
        if m:
            number = m.group(2)
            if m.group(1) == "##":
                parent_optional = optional = bool(m.group(3))
            else:
                optional = parent_optional or bool(m.group(3))
        elif cell["cell_type"] == "markdown" and source.startswith("## "):   # Summary, Quiz, ...
            number = "reading" if source.startswith("## Further reading") else ""
            optional = parent_optional = False
        out.append((number, optional, source))
    return out


def _optional() -> set[tuple[str, str]]:
    """(notebook number, section number) of every optional section of 00-08."""
    return {(name[:2], number) for name in CORE for number, optional, _ in _sections(name) if optional}


def _references(text: str, here: str):
    """(notebook, section, line) for each "notebook NN §X", "NN §X", "§X" or "section X" in text."""
    for line in text.splitlines():
        for m in re.finditer(r"(?:notebook |\b)(\d\d) §(\d+(?:\.\d+)?)", line):
            yield m.group(1), m.group(2), line
        for m in re.finditer(r"(?<!\d\d )(?:§|[Ss]ection )(\d+(?:\.\d+)?)", line):
            yield here, m.group(1), line


def test_some_sections_are_optional_and_say_so():
    optional = _optional()
    assert len(optional) >= 5
    for name in CORE:
        for number, is_optional, source in _sections(name):
            if is_optional and HEADING.match(source) and HEADING.match(source).group(3):
                assert SKIP_LINE in source or "appendix 14" in source.lower(), \
                    f"{name} §{number}: an optional section says what skipping it costs: {SKIP_LINE}"


@pytest.mark.parametrize("name", CORE)
def test_the_path_never_needs_an_optional_section(name):
    optional = _optional()
    for number, is_optional, source in _sections(name):
        if is_optional or number == "reading":          # Further reading cites papers' sections
            continue
        for nb, section, line in _references(source, name[:2]):
            if (nb, section) in optional or (nb, section.split(".")[0]) in optional:
                assert "optional" in line.lower(), \
                    f"{name} (§{number or 'end'}) sends the learner to optional {nb} §{section}: {line.strip()[:160]}"


def test_no_quiz_question_needs_an_optional_section():
    optional = _optional()
    for nb, questions in quizbank.QUIZZES.items():
        for q in questions().questions:
            for _, section, line in _references(q.prompt, nb):
                assert (nb, section) not in optional, f"quiz {nb}: {line[:160]}"


def test_the_readme_lists_the_optional_sections():
    """README: 'Sections titled *Optional* (03 §5, 04 §7 and §8, ...)': the list is the notebooks' own."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = text.split("Sections titled *Optional* (", 1)[1].split(")", 1)[0]
    found = set()
    for part in listed.split(", "):
        nb, rest = part.split(" ", 1)
        found |= {(nb, s) for s in re.findall(r"§(\d+(?:\.\d+)?)", rest)}
    assert found == _optional()
