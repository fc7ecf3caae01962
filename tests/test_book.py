"""`make book`: the executed notebooks as static HTML pages, readable offline.

The offline rule tested on every page: no <script> element at all (so no code has to be
fetched to show the content: the lab template's require.js, MathJax, Mermaid and widget
loaders come from CDNs and are dropped), no <link> to a remote resource, and every
<img> is a data: URI or a file inside the book, except the Open-in-Colab badge (alt text
"Open In Colab"), a link to an online service by nature.

What a reader sees without a kernel, tested too: each quiz with every answer and its
explanation behind a click (<details>), each widget's figure and its text table, and text
outputs never broken inside a word (tables whole, scrolling sideways; prose wraps).
"""
import html
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from course_utils.course import paths as _course
from course_utils.course import book
from course_utils.course.badges import ROOT, notebook_paths


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _tags(text):
    parser = _Tags()
    parser.feed(text)
    return parser.tags


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return book.build(tmp_path_factory.mktemp("book"))


def _stream_text(nb_path):
    """The first line of saved stdout of the notebook: proof that outputs were rendered."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream" and "".join(out["text"]).strip():
                return "".join(out["text"]).strip().splitlines()[0].strip()
    raise AssertionError(f"{nb_path.name} has no saved stdout")


def test_index_lists_every_notebook_in_order(built):
    index = built.index.read_text(encoding="utf-8")
    present = {p.name for p in notebook_paths()}
    assert present, "no notebooks"
    positions = []
    for name, title, _ in _course.NOTEBOOKS:
        heading = html.escape(f"{name[:2]} · {title}")
        assert heading in index, name
        positions.append(index.index(heading))
        stem = Path(name).stem
        if name in present:
            assert f'href="{stem}.html"' in index and (built.out_dir / f"{stem}.html").is_file()
        else:
            assert f'href="{stem}.html"' not in index and name in built.missing
    assert positions == sorted(positions)
    assert [p.notebook for p in built.pages if p.path] == [n for n, _, _ in _course.NOTEBOOKS if n in present]


def test_every_page_has_its_title_and_executed_outputs(built):
    titles = {name: title for name, title, _ in _course.NOTEBOOKS}
    for nb_path in notebook_paths():
        page = (built.out_dir / f"{nb_path.stem}.html").read_text(encoding="utf-8")
        assert f"<title>{html.escape(nb_path.name[:2] + ' · ' + titles[nb_path.name])}</title>" in page
        h1 = json.loads(nb_path.read_text(encoding="utf-8"))["cells"][0]["source"]
        h1 = ("".join(h1)).splitlines()[0].lstrip("# ").strip()
        assert html.escape(h1) in page, nb_path.name                      # the notebook's own H1
        assert html.escape(_stream_text(nb_path), quote=False) in page, nb_path.name  # a saved output
        assert "<svg" in page or "data:image/png;base64," in page, nb_path.name      # figures inline
        assert 'href="index.html"' in page                                           # navigation


def test_pages_need_no_network(built):
    for page in sorted(built.out_dir.glob("*.html")):
        for tag, attrs in _tags(page.read_text(encoding="utf-8")):
            where = f"{page.name}: <{tag} {attrs}>"
            assert tag != "script", where
            if tag == "link":
                assert not attrs.get("href", "").startswith(("http:", "https:", "//")), where
            if tag == "img":
                src = attrs.get("src", "")
                if src.startswith(("http:", "https:", "//")):
                    assert attrs.get("alt") == "Open In Colab", where
                else:
                    assert src.startswith("data:") or (built.out_dir / src).is_file(), where


def test_small_book_is_deterministic_copies_figures_and_marks_missing(tmp_path):
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "vis").mkdir()
    shutil.copy(ROOT / "vis" / "zero_stages.svg", root / "vis")
    nb = nbformat.read(ROOT / "notebooks" / "00_orientation.ipynb", as_version=4)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell("The map: ![course map](../vis/zero_stages.svg)"))
    nbformat.write(nb, root / "notebooks" / "00_orientation.ipynb")

    first = book.build(tmp_path / "a", root=root)
    second = book.build(tmp_path / "b", root=root)
    files_a = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    files_b = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert files_a == files_b
    assert first.figures == [tmp_path / "a" / "vis" / "zero_stages.svg"]
    assert (tmp_path / "a" / "vis" / "zero_stages.svg").read_bytes() == (root / "vis" / "zero_stages.svg").read_bytes()
    page = (tmp_path / "a" / "00_orientation.html").read_text(encoding="utf-8")
    assert any(t == "img" and a.get("src") == "vis/zero_stages.svg" for t, a in _tags(page))
    assert first.missing == [n for n, _, _ in _course.NOTEBOOKS if n != "00_orientation.ipynb"]
    assert "not written yet" in first.index.read_text(encoding="utf-8")
    assert "not written yet" in first.describe()
    assert second.pages[0].path == tmp_path / "b" / "00_orientation.html"


def test_build_validates_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="notebooks/"):
        book.build(tmp_path / "out", root=tmp_path)
    with pytest.raises(TypeError, match="out_dir"):
        book.build(42)


# ------------------------------------------------------------ what a reader sees offline

def _quiz_cells():
    """(notebook path, quiz key) for every notebook whose quiz cell saved an output."""
    found = []
    for nb_path in notebook_paths():
        for cell in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]:
            m = book._QUIZ_CELL.search("".join(cell["source"]))
            if cell["cell_type"] == "code" and m and cell.get("outputs"):
                found.append((nb_path, m.group("key")))
    return found


def test_quizzes_show_their_answers_behind_a_click(built):
    """A quiz output is the quiz a reader checks without a kernel: every question, and its
    answer and explanation in a <details> (no script), not the text form pointing to a
    form that is not there."""
    from course_utils.course import quiz
    from course_utils.course.questions import MultiChoice, SingleChoice

    cells = _quiz_cells()
    assert len(cells) >= 9, cells                      # 00-08 end with a quiz
    for nb_path, key in cells:
        page = (built.out_dir / f"{nb_path.stem}.html").read_text(encoding="utf-8")
        q = quiz.get(key)
        assert page.count("<details><summary>Answer</summary>") == len(q), nb_path.name
        assert "Run this cell to answer" not in page, nb_path.name
        after = page.index('class="course-quiz"')
        for i, question in enumerate(q.questions, 1):
            prompt = html.escape(question.prompt.split("`")[0], quote=False)
            at = page.index(f"<b>{i}.</b> {prompt}", after)
            details = page[page.index("<details>", at):page.index("</details>", at)]
            if isinstance(question, (SingleChoice, MultiChoice)):
                right = [f"({c}) {o}" for c, o in zip(question.letters, question.options) if c in question.answer]
                for c, o in zip(question.letters, question.options):   # every option is listed
                    assert f"<div>{html.escape(f'({c}) {o}', quote=False)}</div>" in page[at:], (nb_path.name, i)
            else:
                right = [question.answer_text()]
            for r in right:
                assert html.escape(r, quote=False) in details, (nb_path.name, i, r)
            assert html.escape(question.explanation, quote=False).split("`")[0] in details, (nb_path.name, i)
            after = at
    page = (built.out_dir / "00_orientation.html").read_text(encoding="utf-8")
    assert "<details><summary>Answer</summary><p><b>36</b></p>" in page   # 00, question 2: summed twice


def _css_rules(page):
    """(selector, {property: value}) of every CSS rule of the page's <style>s, in order."""
    css = "\n".join(re.findall(r"<style[^>]*>(.*?)</style>", page, re.S))
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = []
    for selector, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        decls = dict((k.strip(), v.strip()) for k, _, v in
                     (d.partition(":") for d in body.split(";") if ":" in d))
        rules.append((" ".join(selector.split()), decls))
    return rules


def test_text_outputs_are_not_broken_inside_words(built):
    """The lab template's `.jp-OutputArea-output pre { word-break: break-all }` cut "states"
    into "state|s" at the margin; the book's rule, later in the page, keeps lines whole."""
    for page_path in sorted(built.out_dir.glob("*_*.html")):
        rules = _css_rules(page_path.read_text(encoding="utf-8"))
        breaking = [s for s, d in rules if d.get("word-break") == "break-all"]
        assert set(breaking) <= {".jp-OutputArea-output pre"}, (page_path.name, breaking)
        last = [d for s, d in rules if s == ".jp-OutputArea-output pre"][-1]
        assert last["word-break"] == "normal" and last["white-space"] == "pre", page_path.name
        assert last["overflow-x"] == "auto" and last["overflow-wrap"] == "normal", page_path.name
        prose = [d for s, d in rules if s == ".jp-OutputArea-output pre .book-prose"]
        assert prose == [{"white-space": "pre-wrap", "overflow-wrap": "break-word"}], page_path.name


def test_prose_lines_wrap_between_words_and_table_lines_stay_whole():
    text = ("stage      params    grads\n"
            "DDP         13.48    13.48\n"
            "------------------------------\n"
            "  - model states: DeepSpeed&#39;s layout (bf16 parameters)\n"
            "\n"
            '<span class="ansi-red-fg">error: x y</span>')
    lines = book._book_lines(text).split("\n")
    assert lines[:3] == text.split("\n")[:3]
    assert lines[3] == '<span class="book-prose">  - model states: DeepSpeed&#39;s layout (bf16 parameters)</span>'
    assert lines[4:] == ["", '<span class="ansi-red-fg">error: x y</span>']


def test_widgets_show_their_figure_and_their_text(built):
    """A widget output that carries a figure and a text table (the calculator, the planner
    widget, the ring stepper) shows both offline; a frontend would pick only one."""
    seen = 0
    for nb_path in notebook_paths():
        page = (built.out_dir / f"{nb_path.stem}.html").read_text(encoding="utf-8")
        for cell in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]:
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if not {"application/vnd.jupyter.widget-view+json", "image/png", "text/plain"} <= set(data):
                    continue
                seen += 1
                png = "".join(data["image/png"]).strip()
                text = "".join(data["text/plain"]).splitlines()
                at = page.index(f"data:image/png;base64,{png[:200]}")     # the figure ...
                for line in (text[0], text[-1]):                          # ... then the table
                    assert html.escape(line, quote=False) in page[at:], (nb_path.name, line)
    assert seen >= 3, seen          # the ring stepper (01), the calculator (03), the planner (08)
    page = (built.out_dir / "03_memory_anatomy.html").read_text(encoding="utf-8")
    cell = page[page.index("calculator</span><span class=\"o\">.</span><span class=\"n\">show"):]
    cell = cell[:cell.index('<div class="jp-Cell ')]
    assert "data:image/png;base64," in cell and "stage      params    grads" in cell
    assert "fits in 80 GB: ZeRO-1, ZeRO-2, ZeRO-3" in cell
