"""``make badges``: rewrite every notebook's Open-in-Colab badge and ``REPO, BRANCH = ...``
install line, and README.md's notebook table, from ``paths.py``; :func:`check` only reports."""
from __future__ import annotations

import json
import re
from pathlib import Path

from . import paths

__all__ = ["ROOT", "notebook_paths", "readme_table", "rewrite", "check"]

ROOT = Path(__file__).resolve().parents[2]
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
REPO_LINE_RE = re.compile(r'^(\s*)REPO, BRANCH = "[^"]*", "[^"]*"', re.MULTILINE)
START, END = "<!-- notebooks:start (make badges writes this table) -->", "<!-- notebooks:end -->"


def notebook_paths(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def readme_table(root: Path = ROOT) -> str:
    present = {p.name for p in notebook_paths(root)}
    rows = ["| # | notebook | what you do | open |", "| --- | --- | --- | --- |"]
    rows += [f"| {name[:2]} | [{title}](notebooks/{name}) | {line} | {paths.colab_badge(name)} |" if name in present
             else f"| {name[:2]} | {title} (planned) | {line} | not yet written |" for name, title, line in paths.NOTEBOOKS]
    listed = {n for n, _, _ in paths.NOTEBOOKS}
    for name in sorted(present - listed):  # a notebook the sequence does not list yet
        rows.append(f"| {name[:2]} | [{name}](notebooks/{name}) | | {paths.colab_badge(name)} |")
    return "\n".join(rows)


def _rewrite_notebook(text: str, name: str) -> str:
    nb = json.loads(text)
    badge = paths.colab_badge(name)
    repo_line = f'REPO, BRANCH = "{paths.GITHUB_REPO}", "{paths.BRANCH}"'
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        new = (BADGE_RE.sub(lambda _: badge, src) if cell["cell_type"] == "markdown" else
               REPO_LINE_RE.sub(lambda m: m.group(1) + repo_line, src) if cell["cell_type"] == "code" else src)
        if new != src:
            cell["source"] = new.splitlines(keepends=True)
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def _rewrite_readme(text: str, root: Path) -> str:
    if START not in text or END not in text:
        raise ValueError(f"README.md needs the markers {START!r} and {END!r} around the notebook table")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{readme_table(root)}\n{END}{tail}"


def _targets(root: Path):
    for p in notebook_paths(root):
        yield p, (lambda t, n=p.name: _rewrite_notebook(t, n))
    yield root / "README.md", (lambda t: _rewrite_readme(t, root))


def check(root: Path | str = ROOT, *, write: bool = False) -> list[str]:
    """Files whose badges / install cell / table differ from ``paths`` (``write=True``: rewritten)."""
    root, stale = Path(root), []
    for path, fn in _targets(root):
        text = path.read_text(encoding="utf-8")
        if (new := fn(text)) != text:
            if write:
                path.write_text(new, encoding="utf-8")
            stale.append(str(path.relative_to(root)))
    return stale


def rewrite(root: Path | str = ROOT) -> list[str]:
    """Rewrite every out-of-date file; return the ones changed."""
    return check(root, write=True)


if __name__ == "__main__":
    done = rewrite()
    print("rewrote: " + ", ".join(done) if done else f"badges already point at {paths.GITHUB_REPO}")
