"""The learner's path has a budget (shared/COURSE.md, "Budget and appendices"): each core
notebook (00-08) at most 35k characters of source + text output, 00-08 together at most 230k.

Text output: stream text and the ``text/plain`` of results without an image (a widget's too: a
saved quiz reads as its questions on GitHub and offline, so the learner reads it). ``CEILING``
may hold a notebook's size as last committed while it is above the target: it may shrink below
it, never grow past it; delete the entry once the notebook meets the target.
"""
import json

import pytest

from course_utils.course import paths
from course_utils.course.badges import ROOT

PER_NOTEBOOK, CORE_TOTAL = 35_000, 230_000
CORE = [name for name, _, _ in paths.NOTEBOOKS if name not in paths.APPENDICES]
CEILING: dict = {}


def characters(nb: dict) -> int:
    n = 0
    for cell in nb["cells"]:
        n += len("".join(cell["source"]))
        for out in cell.get("outputs", []):
            if "text" in out:
                n += len("".join(out["text"]))
            data = out.get("data", {})
            if "text/plain" in data and not any(k.startswith("image/") for k in data):
                n += len("".join(data["text/plain"]))
    return n


def _size(name: str) -> int:
    return characters(json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8")))


def test_every_core_notebook_listed_is_core():
    assert CORE[0].startswith("00_") and CORE[-1].startswith("08_") and len(CORE) == 9


@pytest.mark.parametrize("name", CORE)
def test_core_notebook_within_budget(name):
    limit = max(PER_NOTEBOOK, CEILING.get(name, 0))
    assert _size(name) <= limit, f"{name}: {_size(name):,} characters > {limit:,}; move reference " \
                                 "material to an appendix notebook (09+) or cut what repeats"


def test_core_total_within_budget():
    total = sum(_size(n) for n in CORE)
    assert total <= CORE_TOTAL, f"00-08: {total:,} characters > {CORE_TOTAL:,}: cut what repeats"


def test_ceilings_are_not_stale():
    """A ceiling is only for a notebook still above the target: delete it once met."""
    for name, ceiling in CEILING.items():
        assert _size(name) > PER_NOTEBOOK, f"{name} meets the budget: delete its CEILING entry"
        assert ceiling < _size(name) + 2_000, f"{name}: lower its CEILING to {_size(name):,}"
