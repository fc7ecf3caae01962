"""Where hung ranks are stuck, for :func:`~course_utils.runtime.launch.launch`: each hung rank dumps
its Python stack twice (faulthandler on SIGUSR1), 0.3 s apart, and its CPU time is read between the
two (Linux ``/proc``), so that a rank still running (an endless loop) is told from one waiting in a
collective; the dumps are cut where the launcher's own frames begin."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from typing import Callable

__all__ = ["dump_hung_stacks", "user_stack", "user_stacks"]

#: Seconds between a hung rank's two stack dumps: a rank whose stacks differ, or that used more
#: than :data:`BUSY_FRACTION` of a core meanwhile, is still running (a rank waiting in a
#: collective sleeps; one looping over collectives may be caught in the same wait twice).
SECOND_DUMP_S = 0.3
BUSY_FRACTION = 0.25


def user_stack(dump: str) -> str:
    """A faulthandler dump, innermost first, cut where the launcher's own frames begin."""
    lines = dump.splitlines()
    cut = next((i for i, line in enumerate(lines) if " in _rank_main" in line), len(lines))
    return "\n".join(lines[:cut]).strip()


def user_stacks(dumps: str) -> list[str]:
    """Each of the faulthandler dumps in one stack file, as :func:`user_stack`."""
    parts = re.split(r"^.*\(most recent call first\):$", dumps, flags=re.MULTILINE)
    return [user_stack(part) for part in parts if " in _rank_main" in part]


def _await_stacks(paths: list, read: Callable[[str], str], timeout_s: float = 3.0, count: int = 1) -> None:
    """Until each stack file holds ``count`` dumps that reached the launcher's frame (whole then:
    they are innermost first), or ``timeout_s`` (a rank whose dump never comes; a few seconds, as a
    rank on a loaded 2-core machine may wait that long to be scheduled and write it)."""
    deadline = time.monotonic() + timeout_s
    while not all(read(p).count(" in _rank_main") >= count for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)


def _cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (Linux ``/proc``); 0.0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def dump_hung_stacks(procs: list, hung: list, workdir: str, read: Callable[[str], str]) -> set:
    """Make each hung rank dump its stack into ``workdir/rank<r>.stack``, twice; the ranks that used
    CPU in between (still running, not waiting)."""
    cpu: dict = {}
    for count in (1, 2):
        if count == 2:
            time.sleep(SECOND_DUMP_S)
        for r in hung:
            cpu[r] = _cpu_seconds(procs[r].pid) - cpu.get(r, 0.0)
            with contextlib.suppress(Exception):
                os.kill(procs[r].pid, signal.SIGUSR1)
        _await_stacks([os.path.join(workdir, f"rank{r}.stack") for r in hung], read, count=count)
    return {r for r in hung if cpu[r] > BUSY_FRACTION * SECOND_DUMP_S}
