"""Byte units and plain-text tables, the package's one formatter of each (re-exported by
:mod:`course_utils.runtime.fmt`); in ``theory``, the lowest layer that prints."""
from __future__ import annotations

from numbers import Integral

__all__ = ["GB", "GiB", "UNITS", "to_unit", "fmt_bytes", "table"]

GB = 10**9      #: the ZeRO paper's "GB" (decimal)
GiB = 2**30     #: what nvidia-smi and DeepSpeed's estimators print (they label it "GB")
UNITS = {"B": 1, "KiB": 2**10, "MB": 10**6, "MiB": 2**20, "GB": GB, "GiB": GiB, "TiB": 2**40}
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")


def to_unit(num_bytes, unit: str = "GB") -> float:
    """Bytes expressed in ``unit`` ("GB" = 1e9 bytes, "GiB" = 2**30 bytes, ...)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {sorted(UNITS)}, got {unit!r}")
    return num_bytes / UNITS[unit]


def fmt_bytes(num_bytes, unit: str | None = "GB", digits: int = 1, *, sep: bool = False,
              sig: bool = False, largest: str = "TiB") -> str:
    """``fmt_bytes(28e9) == "28.0 GB"``; ``unit="auto"``: the largest binary unit up to
    ``largest`` the value reaches; ``unit=None``: the bare number, an int exactly."""
    auto = unit == "auto"
    if auto:
        top = _BINARY.index(largest)
        unit = next(u for u in reversed(_BINARY[:top + 1]) if abs(num_bytes) >= UNITS[u] or u == "B")
    value = num_bytes if unit is None else to_unit(num_bytes, unit)
    comma = "," if sep else ""
    if unit is None and isinstance(num_bytes, Integral):
        text = f"{num_bytes:{comma}}"
    elif auto and unit == "B":
        text = f"{value:{comma}g}" if sig else f"{value:{comma}.0f}"
    else:
        text = f"{value:{comma}.{digits}{'g' if sig else 'f'}}"
    return text if unit is None else f"{text} {unit}"


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, Integral):
        return f"{v:,}"
    if isinstance(v, float):
        if v.is_integer() and abs(v) >= 1:
            return f"{v:,.0f}"
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


def table(header, rows, *, notes=(), left=(0,), rules=(0,)) -> str:
    """A plain-text table; ``left``: left-aligned column indices; a dashed rule follows each
    line whose index is in ``rules`` (0: the header, k: the k-th row); ``notes`` below."""
    if not isinstance(header, (list, tuple)) or not header:
        raise TypeError("header must be a non-empty list of column names")
    left = set(left)
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(header) for i in left):
        raise ValueError(f"left must hold column indices 0..{len(header) - 1}, got {sorted(left, key=str)}")
    cells = [[str(h) for h in header]]
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"each row needs {len(header)} cells (one per column), got {len(r)}: {r!r}")
        cells.append([_cell(v) for v in r])
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for k, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i in left else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if k in rules:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines + [str(n) for n in notes])
