"""The builds' hints, three levels each, printed one level per call by ``hint("ddp")``: where to
start (the questions to ask), what each piece is, then how, as a trace; said as a trace or a shape,
never as the answer's code. The texts are package data, one file per build
(``course_utils/course/hints/ddp.txt``, ...): a file shows all its levels at once, so open one only
when you want them all."""
from pathlib import Path

#: where the texts live: ``NAME.txt`` per build exercise, its levels split by :data:`LEVEL_BREAK`
TEXTS = Path(__file__).resolve().parent.parent / "hints"
#: the line between two levels of a hint file
LEVEL_BREAK = "\n~~~ the next level: call hint() again ~~~\n"


def _levels(path: Path) -> tuple[str, ...]:
    return tuple(level.strip("\n") for level in path.read_text(encoding="utf-8").split(LEVEL_BREAK))


#: build exercise -> its hints, one per call of :func:`hint`
HINTS = {path.stem: _levels(path) for path in sorted(TEXTS.glob("*.txt"))}
