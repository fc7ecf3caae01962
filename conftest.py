"""Root conftest: hooks that must see every test item, the notebooks' included (a
conftest under tests/ only sees the items under tests/)."""
import os


# --------------------------------------------------------- each notebook's "Runs in" line, measured
# nbval runs a notebook's cells as test items; their durations add up to the notebook's
# run time on this machine. The summary prints it next to the notebook's own "Runs in
# about N s" claim, so every CI log shows whether the claims still hold (no assertion:
# timings vary with the machine and its load).
_NB_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _NB_SECONDS[path] = _NB_SECONDS.get(path, 0.0) + report.duration


def runs_in_claim(path: str) -> int | None:
    """The N of a notebook's "**Runs in** about N s" line, or None when it has none."""
    import json
    import re

    with open(path, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    for cell in cells[:3]:
        m = re.search(r"\*\*Runs in\*\* about (\d+) s", "".join(cell["source"]))
        if m:
            return int(m.group(1))
    return None


def pytest_terminal_summary(terminalreporter):
    if not _NB_SECONDS:
        return
    terminalreporter.section("notebooks: measured run time vs the 'Runs in' line")
    for path, seconds in sorted(_NB_SECONDS.items()):
        claim = runs_in_claim(path) if os.path.exists(path) else None
        said = f"says about {claim} s" if claim is not None else "has no 'Runs in' line"
        over = "  <- longer than it says" if claim is not None and seconds > 1.5 * claim else ""
        terminalreporter.write_line(f"{path:45} {seconds:6.1f} s here; {said}{over}")
