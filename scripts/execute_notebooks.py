"""Re-execute notebooks in place, top to bottom in one fresh kernel each: `make outputs`.

The committed outputs are what nbval compares against, so after changing a notebook or
the code it prints, run this (GPUs hidden, as `make test` does) and commit the result:

    make outputs                 # every notebook
    make outputs NB=07           # one notebook (NB=notebooks/07_fsdp.ipynb works too)

Cells are executed as nbval executes them (the kernel starts in notebooks/), widget
state is kept (the offline book and GitHub show it), and no timing metadata is written,
so that a re-run that prints the same text leaves the file unchanged.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path, timeout_s: int = 900) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", record_timing=False,
                   store_widget_state=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="paths, or NN prefixes (default: all)")
    args = parser.parse_args(argv)
    folder = ROOT / "notebooks"
    paths = []
    for item in args.notebooks or [""]:
        found = [Path(item)] if item.endswith(".ipynb") else sorted(folder.glob(f"{item}*.ipynb"))
        if not found or not all(p.is_file() for p in found):
            parser.error(f"no notebook matches {item!r} in {folder}")
        paths += found
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    for path in paths:
        print(f"{path.name}: {execute(path):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
