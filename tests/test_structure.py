"""Every notebook of the series has the same skeleton, in the same order.

For each notebook of ``course_utils.course.paths.NOTEBOOKS`` that exists (07 and 08 join the
checks when they are written), as notebooks 00-06 write it:

* cell 0, markdown: ``# NN · <title from _course>...``, then its own Open-in-Colab badge,
  ``**You will learn**`` with a bulleted list, ``**Prerequisites:** ...`` and the runtime
  line ``**Runs in** about N s on a laptop CPU.``;
* cell 1, the first code cell: the Colab bootstrap (clone + install on Colab only), with
  the ``REPO, BRANCH`` of ``_course``;
* then the numbered sections ``## 1. ...``, ``## 2. ...`` (subsections ``### k.1``,
  ``### k.2`` ... inside section k), and last, in this order, ``## Summary`` (a bulleted
  list), ``## Quiz`` (the next code cell calls ``quiz.show("NN")``; an appendix of
  ``_course.APPENDICES`` says "No quiz" instead), ``## Exercises``
  (code cells call a ``check_*`` helper) and ``## Further reading``, which ends the
  notebook. One H1 per notebook.

And README.md's notebook table links every notebook that exists.
"""
import json
import re

import pytest

from course_utils.course import paths as _course
from course_utils.course.badges import ROOT, notebook_paths

EXISTING = [(name, title) for name, title, _ in _course.NOTEBOOKS if (ROOT / "notebooks" / name).exists()]
TAIL = ["Summary", "Quiz", "Exercises", "Further reading"]
RUNTIME = re.compile(r"^\*\*Runs in\*\* about \d+ (s|min) on a laptop CPU\.$", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


def _cells(name):
    return json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]


def _src(cell):
    return "".join(cell["source"])


def _headings(cells):
    """(level, text, cell index) of every markdown heading, outside fenced code."""
    out = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in _src(cell).splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            m = None if fenced else HEADING.match(line)
            if m:
                out.append((len(m.group(1)), m.group(2), i))
    return out


def test_the_series_has_notebooks_and_lists_them_all():
    assert EXISTING, "no notebook of _course.NOTEBOOKS exists"
    listed = {name for name, _, _ in _course.NOTEBOOKS}
    strays = [p.name for p in notebook_paths() if p.name not in listed]
    assert not strays, f"add {strays} to course_utils/course/paths.py NOTEBOOKS (file, title, one line)"


@pytest.mark.parametrize("name,title", EXISTING, ids=[n for n, _ in EXISTING])
def test_header_cell(name, title):
    first = _cells(name)[0]
    assert first["cell_type"] == "markdown", f"{name}: cell 0 must be the markdown title cell"
    text = _src(first)
    h1 = text.splitlines()[0]
    assert h1.startswith(f"# {name[:2]} · {title}"), f"{name}: title line {h1!r}"
    assert _course.colab_badge(name) in text, f"{name}: no Open-in-Colab badge for itself (make badges)"
    learn = re.search(r"^\*\*You will learn\*\*\n((?:- .+\n?)+)", text, re.MULTILINE)
    assert learn and learn.group(1).count("\n- ") >= 1, f"{name}: '**You will learn**' + a bulleted list"
    assert re.search(r"^\*\*Prerequisites:\*\* \S", text, re.MULTILINE), f"{name}: '**Prerequisites:** ...'"
    assert RUNTIME.search(text), f"{name}: runtime line '**Runs in** about N s on a laptop CPU.'"
    order = [text.index(s) for s in (_course.colab_badge(name), "**You will learn**", "**Prerequisites:**",
                                      "**Runs in**")]
    assert order == sorted(order), f"{name}: badge, learn-goals, prerequisites, runtime, in this order"


@pytest.mark.parametrize("name", [n for n, _ in EXISTING])
def test_first_code_cell_is_the_colab_bootstrap(name):
    cells = _cells(name)
    first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    assert first_code == 1, f"{name}: the Colab cell must come right after the title cell"
    src = _src(cells[first_code])
    assert 'if "google.colab" in sys.modules:' in src, name
    assert f'REPO, BRANCH = "{_course.GITHUB_REPO}", "{_course.BRANCH}"' in src, f"{name}: run make badges"
    assert "git\", \"clone\"" in src and "pip\", \"install\"" in src, name


@pytest.mark.parametrize("name", [n for n, _ in EXISTING])
def test_numbered_sections_then_summary_quiz_exercises_further_reading(name):
    cells = _cells(name)
    heads = _headings(cells)
    assert [h for h in heads if h[0] == 1] == [heads[0]] and heads[0][2] == 0, f"{name}: one H1, in cell 0"
    h2 = [(text, i) for level, text, i in heads if level == 2]
    # a build notebook's exercises sit in its sections, right after the idea each builds
    tail = TAIL if any(t == "Exercises" for t, _ in h2) else [t for t in TAIL if t != "Exercises"]
    numbered = [t for t, _ in h2[:len(h2) - len(tail)]]
    assert [t for t, _ in h2[-len(tail):]] == tail, f"{name}: must end with ## {' / ## '.join(tail)}"
    assert len(numbered) >= 2, f"{name}: at least two numbered sections"
    for k, text in enumerate(numbered, start=1):
        assert re.match(rf"{k}\. \S", text), f"{name}: section {k} is {text!r}, expected '## {k}. ...'"
    section, sub = 0, 0
    for level, text, _ in heads[1:]:
        if level == 2:
            m = re.match(r"(\d+)\. ", text)
            section, sub = (int(m.group(1)) if m else None), 0
        elif level == 3:
            sub += 1
            assert section and re.match(rf"{section}\.{sub} \S", text), \
                f"{name}: subsection {text!r} should be '### {section}.{sub} ...'"
    where = {t: i for t, i in h2}
    assert where["Further reading"] == len(cells) - 1, f"{name}: Further reading ends the notebook"
    summary = _src(cells[where["Summary"]]).split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^- ", summary, re.MULTILINE)) >= 3, f"{name}: the summary is a bulleted list"
    if name in _course.APPENDICES:          # an optional appendix says so instead of a quiz
        quiz_text = _src(cells[where["Quiz"]]).split("## Quiz", 1)[1]
        assert "no quiz" in quiz_text.lower(), f"{name}: an appendix's ## Quiz says 'No quiz: ...'"
    else:
        quiz_code = next(_src(c) for c in cells[where["Quiz"] + 1:] if c["cell_type"] == "code")
        assert f'quiz.show("{name[:2]}")' in quiz_code, f"{name}: the cell after ## Quiz shows quiz {name[:2]}"
    exercise_code = [_src(c) for c in cells[where.get("Exercises", 1) + 1:where["Further reading"] + 1]
                     if c["cell_type"] == "code"]
    assert any(re.search(r"\bcheck_\w+\(", s) for s in exercise_code), f"{name}: exercises call a check_*()"


def test_readme_table_links_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, title in EXISTING:
        row = re.search(rf"^\| {name[:2]} \| \[{re.escape(title)}\]\(notebooks/{re.escape(name)}\) \|.*$",
                        readme, re.MULTILINE)
        assert row, f"README.md does not link {name} (make badges)"
        assert _course.colab_badge(name) in row.group(0), f"README.md: {name}'s row has no Colab badge"


#: How the source documents were named while writing the course; the learner never saw
#: them, so nothing a learner reads may name them (COURSE.md).
SOURCE_NAMES = re.compile(r"\bseeds?\s+00\d|\bseed[-_]?00\d|\bthe seeds\b|\bseeds'|\bseed's\b", re.IGNORECASE)


def _learner_text():
    """(where, text) of everything a learner reads: each notebook's file (cells, outputs and
    the saved widget state, which holds the quiz questions), the README and the pages of docs/
    it links, and the package's source (its docstrings and the strings it prints)."""
    for path in [*notebook_paths(), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "course_utils").rglob("*.py"))]:
        yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def test_nothing_a_learner_reads_names_the_source_documents():
    hits = [f"{where}: {m.group(0)!r}" for where, text in _learner_text()
            for m in SOURCE_NAMES.finditer(text)]
    assert hits == []


def test_the_learner_text_covers_every_module_of_the_package():
    read = {where for where, _ in _learner_text()}
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "course_utils").rglob("*.py")}
    assert modules <= read and "course_utils/impl/zero3.py" in read
    assert {"README.md", "docs/where-it-runs.md"} <= read


def test_the_source_names_pattern_finds_them():
    for text in ("seed 003 says", "Seed 001's advice", "the seeds' exercise", "SEED003", "seed_001",
                 "the seed's formula"):
        assert SOURCE_NAMES.search(text), text
    for text in ("seed=0", "torch.manual_seed(seed + rank)", "one seed for the model"):
        assert not SOURCE_NAMES.search(text), text
