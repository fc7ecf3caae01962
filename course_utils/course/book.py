"""The notebooks as a static HTML book with their saved outputs, for reading offline (``make book``).

Offline-safe: nbconvert's ``lab`` template without ``<script>`` (no CDN; ``$...$`` math shows as raw TeX),
images and CSS inline; quizzes with answers behind ``<details>``, other widgets in their static form;
table lines stay whole and scroll, prose wraps. Same notebooks, same bytes.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import html
import re
import shutil
from pathlib import Path

from . import paths, quiz
from .badges import ROOT, notebook_paths

__all__ = ["BOOK_DIR", "Page", "Book", "build", "main"]

BOOK_DIR = ROOT / "_build" / "book"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_QUIZ_CELL = re.compile(r"""\bquiz\.show\(\s*["'](?P<key>[^"']+)["']\s*\)""")
_COLUMNS = re.compile(r"\S {2,}\S")   # a line of a table: columns apart by 2+ spaces
_WORDS = re.compile(r"\S \S")          # a line of prose: words apart by one space
_VIS_REF = re.compile(r"(?P<prefix>\.\./|\./)?vis/(?P<file>[A-Za-z0-9_.-]+\.(?:svg|png))")
_TEMPLATE = "course_book.html.j2"
_TEMPLATE_SOURCE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">
nav.book-nav { max-width: 1100px; margin: 0.6em auto; font-family: var(--jp-ui-font-family);
               display: flex; justify-content: space-between; gap: 1em; }
.course-quiz details { margin: 0.2em 0 0.8em 1.5em; }
.course-quiz summary { cursor: pointer; color: var(--jp-content-link-color, #1976d2); }
</style>{%- endblock extra_css -%}
{%- block html_head_css -%}{{ super() }}<style type="text/css">
/* after the lab CSS, which breaks text anywhere: lines stay whole (tables scroll), prose wraps */
.jp-OutputArea-output pre { white-space: pre; word-break: normal; overflow-wrap: normal;
                            word-wrap: normal; overflow-x: auto; }
.jp-OutputArea-output pre .book-prose { white-space: pre-wrap; overflow-wrap: break-word; }
/* an HTML output's <pre> (versus()'s reveal) in the code font, as the printed lines around it */
.jp-RenderedHTMLCommon pre { font-family: var(--jp-code-font-family); }
.jp-RenderedMarkdown details, .jp-RenderedHTMLCommon details { margin: 0.4em 0; }
</style>{%- endblock html_head_css -%}
{%- block body_header -%}{{ super() }}{{ resources.book_nav }}{%- endblock body_header -%}
{% block body_footer %}{{ resources.book_nav }}{{ super() }}{% endblock body_footer %}
"""


@dataclasses.dataclass(frozen=True)
class Page:
    """One notebook of the sequence: ``path`` is its HTML page, None if not written yet."""
    notebook: str
    title: str
    line: str
    path: Path | None


@dataclasses.dataclass(frozen=True)
class Book:
    """What :func:`build` wrote: the index, one :class:`Page` per notebook, copied figures."""
    out_dir: Path
    index: Path
    pages: list
    figures: list

    @property
    def missing(self) -> list[str]:
        """Notebooks of the sequence that do not exist yet."""
        return [p.notebook for p in self.pages if p.path is None]

    def describe(self) -> str:
        text = f"wrote {self.index} and {len(self.pages) - len(self.missing)} pages"
        return text + (f" ({', '.join(self.missing)} not written yet)" if self.missing else "")


def _sequence(root: Path) -> list[tuple[str, str, str, Path | None]]:
    """(notebook, title, line, source or None) in course order, then unlisted notebooks."""
    present = {p.name: p for p in notebook_paths(root)}
    out = [(name, title, line, present.get(name)) for name, title, line in paths.NOTEBOOKS]
    listed = {name for name, _, _ in paths.NOTEBOOKS}
    out += [(name, Path(name).stem, "", present[name]) for name in sorted(set(present) - listed)]
    return out


def _book_lines(text_html: str) -> str:
    """Each prose line of an ansi2html text marked ``book-prose`` (wraps); columns, rules, ANSI stay whole."""
    return "\n".join(f'<span class="book-prose">{line}</span>'
                     if _WORDS.search(line) and not _COLUMNS.search(line) and "<" not in line
                     else line for line in text_html.split("\n"))


def _ansi2html(text: str) -> str:
    """The lab template's text-output filter, then :func:`_book_lines`."""
    from nbconvert.filters import ansi2html
    return _book_lines(ansi2html(text))


def _heading(notebook: str, title: str) -> str:
    return f"{notebook[:2]} · {title}"


def _quiz_html(source: str, data: dict) -> str | None:
    """The quiz with its answers (HTML) if ``data`` is the output of ``quiz.show("NN")``."""
    match = _QUIZ_CELL.search(source)
    if not match or not str(data.get("text/plain", "")).startswith("Quiz:"):
        return None
    try:
        return quiz.get(match.group("key")).answers_html()
    except ValueError:             # not a quiz of the bank: keep its text form
        return None


def _offline_outputs(cell) -> list:
    """``cell``'s outputs without widgets: a quiz with its answers, a widget's static parts one output
    each (a page draws one mime type of an output)."""
    outputs = []
    for out in cell.get("outputs", []):
        data = out.get("data")
        if data is None or _WIDGET_VIEW not in data:
            outputs.append(out)
            continue
        del data[_WIDGET_VIEW]
        html_form = _quiz_html("".join(cell.source), data)
        if html_form is not None:
            data = {"text/html": html_form}
        parts = [m for m in ("text/html", "image/png", "text/plain")   # HTML is the richer text form
                 if m in data and not (m == "text/plain" and "text/html" in data)]
        for mime in parts:
            part = copy.copy(out)
            part.data = {mime: data[mime]}
            part.metadata = {mime: out.metadata[mime]} if mime in out.get("metadata", {}) else {}
            outputs.append(part)
    return outputs


def _offline_notebook(nb, vis_dir: Path, out_dir: Path, copied: set):
    """A copy of ``nb`` with static outputs and its ``vis/`` figures copied next to the pages."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            def repoint(m):
                src = vis_dir / m.group("file")
                if not src.is_file():
                    return m.group(0)
                (out_dir / "vis").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out_dir / "vis" / src.name)
                copied.add(out_dir / "vis" / src.name)
                return f"vis/{src.name}"
            cell.source = _VIS_REF.sub(repoint, "".join(cell.source))
        elif cell.cell_type == "code":
            cell.outputs = _offline_outputs(cell)
    return nb


def _nav(pages: list[Page], i: int) -> str:
    def link(page: Page | None, label: str) -> str:
        return f'<a href="{page.path.name}">{html.escape(label)}</a>' if page and page.path else "<span></span>"

    prev = next((p for p in reversed(pages[:i]) if p.path is not None), None)
    nxt = next((p for p in pages[i + 1:] if p.path is not None), None)
    return ('<nav class="book-nav">'
            + link(prev, f"← {_heading(prev.notebook, prev.title)}" if prev else "")
            + '<a href="index.html">contents</a>'
            + link(nxt, f"{_heading(nxt.notebook, nxt.title)} →" if nxt else "")
            + "</nav>")


def _index_html(pages: list[Page]) -> str:
    body = "\n".join(
        (f'<li><span class="missing">{head}</span> <em>(not written yet)</em>' if p.path is None
         else f'<li><a href="{p.path.name}">{head}</a>') + f"<br><small>{html.escape(p.line)}</small></li>"
        for p in pages for head in [html.escape(_heading(p.notebook, p.title))])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>ZeRO to FSDP</title>
<style type="text/css">
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 46em;
       margin: 2em auto; padding: 0 1em; line-height: 1.5; color: #222; }}
li {{ margin: 0.6em 0; }}
.missing {{ color: #777; }}
small {{ color: #555; }}
</style>
</head>
<body>
<h1>ZeRO to FSDP</h1>
<p>From data parallelism through ZeRO-1, ZeRO-2 and ZeRO-3 to PyTorch FSDP. These pages are
the course notebooks with their saved outputs, for reading offline. To run the code, open the
notebooks (<code>make lab</code>, or the Open-in-Colab badge at the top of each page).</p>
<ol start="0">
{body}
</ol>
<p><small>Each quiz appears with its answers behind a click, each widget as its figure and
its text; their interactive forms need a running notebook.</small></p>
</body>
</html>
"""


def build(out_dir: Path | str = BOOK_DIR, *, root: Path | str = ROOT) -> Book:
    """Write the HTML book of ``<root>/notebooks`` into ``out_dir`` (nothing is executed)."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    if not isinstance(out_dir, (str, Path)):
        raise TypeError(f"out_dir must be a path such as '_build/book', got {type(out_dir).__name__}")
    if not isinstance(root, (str, Path)):
        raise TypeError(f"root must be the course's folder (a path), got {type(root).__name__}")
    out_dir, root = Path(out_dir), Path(root)
    if not (root / "notebooks").is_dir():
        raise ValueError(f"{root} has no notebooks/ folder: pass root=<the course's folder>")
    out_dir.mkdir(parents=True, exist_ok=True)

    sequence = _sequence(root)
    pages = [Page(name, title, line, out_dir / f"{Path(name).stem}.html" if src else None)
             for name, title, line, src in sequence]
    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({_TEMPLATE: _TEMPLATE_SOURCE})])
    exporter.template_file = _TEMPLATE
    exporter.register_filter("ansi2html", _ansi2html)
    copied: set = set()
    for i, ((name, title, _line, src), page) in enumerate(zip(sequence, pages)):
        if src is None:
            continue
        nb = _offline_notebook(nbformat.read(src, as_version=4), root / "vis", out_dir, copied)
        nb.metadata["title"] = _heading(name, title)
        body, _ = exporter.from_notebook_node(nb, resources={
            "metadata": {"name": src.stem, "path": str(src.parent)}, "book_nav": _nav(pages, i)})
        page.path.write_text(body, encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(_index_html(pages), encoding="utf-8")
    return Book(out_dir=out_dir, index=index, pages=pages, figures=sorted(copied))


def main(argv=None) -> Book:
    parser = argparse.ArgumentParser(prog="python -m course_utils.course.book",
                                     description="Build the static HTML book of the notebooks (make book).")
    parser.add_argument("--out", default=str(BOOK_DIR.relative_to(ROOT)),
                        help="output folder, relative to the course folder (default: _build/book)")
    book = build(ROOT / parser.parse_args(argv).out)   # an absolute --out stays as it is
    print(book.describe())
    return book


if __name__ == "__main__":  # python -m course_utils.course.book  (what `make book` runs)
    main()
