"""impl/ holds the algorithms a learner reads and nothing else: no plotting, widgets, timing,
ledgers or printing (issue 26). Drawings live in course/, timing and demos in labs/,
predictions in theory/, measuring in harness/."""
import re
from pathlib import Path

import pytest

import course_utils

IMPL = Path(course_utils.__file__).parent / "impl"
FORBIDDEN = re.compile(r"matplotlib|ipywidgets|\bwidgets\b|perf_counter|CommLedger|\bledger\b|\bprint\("
                       r"|\.timeline\b|event_log|\b_log\(|peak_|_note_peak")


@pytest.mark.parametrize("name", sorted(p.name for p in IMPL.glob("*.py")))
def test_impl_module_has_no_plotting_widget_timing_or_ledger_code(name):
    source = (IMPL / name).read_text(encoding="utf-8")
    hits = [f"{name}:{i}: {line.strip()}" for i, line in enumerate(source.splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits)
