"""Where in the learner's code a rank raised or hung: the graders' pointer into a traceback
or a hung rank's stack. The learner's code is every file that is not the course's package
(its ``course/solutions/`` answers excepted: tests grade them as a learner's), torch, another
installed package or the standard library: in a notebook a cell (``/tmp/ipykernel_*/…py``,
``<ipython-input-…>``), in the tests the file a class was defined in.
"""
from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sysconfig
import traceback

__all__ = ["Frame", "frames_of", "learner_frame", "describe", "raised_at", "collective_of",
           "is_learners", "in_torch"]

_FRAME = re.compile(r'File "(?P<file>.+?)", line (?P<line>\d+),? in (?P<func>\S+)')


@dataclasses.dataclass
class Frame:
    file: str
    line: int
    func: str
    code: str = ""


def _real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _library_dirs() -> tuple:
    import torch
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))          # course_utils/
    dirs = {_real(os.path.dirname(torch.__file__)), _real(here)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_key = sysconfig.get_paths().get(key)
        if with_key:
            dirs.add(_real(with_key))
    return tuple(sorted(dirs)), _real(os.path.join(here, "course", "solutions"))


_DIRS: tuple | None = None


def is_learners(path: str) -> bool:
    """Whether ``path`` (a frame's file) is the learner's code (see the module docstring)."""
    global _DIRS
    if path.startswith("<"):
        return path.startswith(("<ipython-input", "<string>", "<stdin>"))
    if _DIRS is None:
        _DIRS = _library_dirs()
    libraries, answers = _DIRS
    real = _real(path)
    if real.startswith(answers + os.sep):
        return True
    if "site-packages" in real.split(os.sep) or "dist-packages" in real.split(os.sep):
        return False
    return not any(real.startswith(d + os.sep) for d in libraries)


def in_torch(path: str) -> bool:
    """Whether ``path`` is one of torch's files."""
    return "torch" in _real(path).split(os.sep)


def _in_torch_distributed(path: str) -> bool:
    parts = _real(path).split(os.sep)
    return "torch" in parts and "distributed" in parts[parts.index("torch"):]


def frames_of(text: str, *, innermost_first: bool) -> list[Frame]:
    """The frames of a traceback (``innermost_first=False``; only its last exception) or a
    faulthandler dump (``True``), innermost first, each with its source line where known."""
    lines = text.splitlines()
    if not innermost_first:
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        lines = lines[starts[-1]:] if starts else lines
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME.search(line)
        if not m:
            continue
        code = ""
        if not innermost_first and i + 1 < len(lines) and lines[i + 1].startswith("    ") \
                and not _FRAME.search(lines[i + 1]):
            code = lines[i + 1].strip()
        frame = Frame(m["file"], int(m["line"]), m["func"], code)
        frame.code = frame.code or linecache.getline(frame.file, frame.line).strip()
        frames.append(frame)
    return frames if innermost_first else frames[::-1]


#: Frames Python makes for a comprehension inside a function (3.11; 3.12 inlines them): named
#: by the function around them, where the learner looks.
_COMPREHENSIONS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


def learner_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of ``frames`` (innermost first) in the learner's code, or None.
    Code made at run time (a dataclass's ``__init__``: ``<string>`` with no source) counts only
    when no frame of a real file does; a comprehension's frame is named by its function's."""
    mine = [f for f in frames if is_learners(f.file)]
    mine = [f for f in mine if not (f.file.startswith("<") and not f.code)] or mine
    if not mine:
        return None
    inner = mine[0]
    if inner.func in _COMPREHENSIONS:
        around = next((f for f in mine[1:] if f.file == inner.file and f.func not in _COMPREHENSIONS), None)
        if around is not None:
            return dataclasses.replace(inner, func=around.func)
    return inner


#: torch.distributed's functions that wait for other ranks, by name (``reduce_scatter_single``
#: is what torch 2.x's ``reduce_scatter_tensor`` calls); a hang inside one: waiting for them.
_COLLECTIVE = re.compile(r"^_?(all_|reduce|broadcast|barrier|gather|scatter|send|recv|isend|irecv|"
                         r"monitored_barrier|batch_isend|wait$)")


def collective_of(frames: list[Frame]) -> str:
    """The collective the innermost frames (those before the learner's) wait in, by the name
    the learner called (``"all_reduce"``, ``"reduce_scatter_tensor"``; ``"wait"``: a Work's), or ''."""
    if not frames or not _COLLECTIVE.match(frames[0].func) or is_learners(frames[0].file):
        return ""                 # e.g. get_rank, or the learner's own code: not waiting for anyone
    names = []
    for frame in frames:
        if is_learners(frame.file):
            break
        if _COLLECTIVE.match(frame.func):
            names.append(frame.func)
    return names[-1]


def _shown_file(path: str) -> str:
    if path.startswith("<ipython-input") or "ipykernel_" in path:
        return "your cell"
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def describe(frame: Frame) -> str:
    """``solutions/ddp.py:27 in _on_grad: self.ready.add(p)`` (``your cell, line 27`` in a notebook)."""
    shown = _shown_file(frame.file)
    where = f"{shown}, line {frame.line}" if shown == "your cell" else f"{shown}:{frame.line}"
    code = frame.code if len(frame.code) <= 100 else frame.code[:97] + "..."
    return f"{where} in {frame.func}" + (f": {code}" if code else "")


def raised_at(exc: BaseException) -> str:
    """`` (at <describe(learner's frame)>)`` for an exception caught in a rank, or ''."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    frame = learner_frame(frames_of(text, innermost_first=False))
    return f" (at {describe(frame)})" if frame else ""
