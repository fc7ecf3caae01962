"""One helper for the tests that hold a notebook's typed figures to the code that computes them."""
import json
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cell_source(notebook: str, marker: str) -> str:
    """The source of the one cell of ``notebooks/<notebook>`` that contains ``marker``."""
    cells = json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))["cells"]
    found = ["".join(c["source"]) for c in cells if marker in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: {len(found)} cells contain {marker!r}, expected one"
    return found[0]


def cell_output(notebook: str, marker: str) -> str:
    """The committed text output (streams and text/plain) of the one cell whose source contains ``marker``."""
    cells = json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))["cells"]
    found = [c for c in cells if marker in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: {len(found)} cells contain {marker!r}, expected one"
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in found[0].get("outputs", []))
