"""`make book`: the executed notebooks as static HTML pages, readable offline.

The offline rule tested on every page: no <script> element at all (so no code has to be
fetched to show the content: the lab template's require.js, MathJax, Mermaid and widget
loaders come from CDNs and are dropped), no <link> to a remote resource, and every
<img> is a data: URI or a file inside the book, except the Open-in-Colab badge (alt text
"Open In Colab"), a link to an online service by nature.
"""
import html
import json
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
