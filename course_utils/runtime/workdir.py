"""The folder a launch keeps its ranks' files in, and the sweep of those a killed launcher left."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

__all__ = ["make_workdir", "sweep_stale_workdirs"]

#: a launch's files (each rank's output, result, error) live in ``<tmp>/course-launch-<pid>-*``
_WORKDIR_PREFIX = "course-launch-"


def sweep_stale_workdirs() -> list[str]:
    """Remove the work directories of launching processes that no longer exist (a kernel killed
    mid-launch leaves its directory behind); which it removed. POSIX only: elsewhere a dead
    process cannot be told from a live one without side effects."""
    if os.name != "posix":
        return []
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            match = re.fullmatch(re.escape(_WORKDIR_PREFIX) + r"(\d+)-\w+", entry.name)
            if not match or not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            try:
                os.kill(int(match.group(1)), 0)
            except ProcessLookupError:                 # its launcher is gone
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
            except (PermissionError, OverflowError):   # alive (another user's), or not a pid
                pass
    return removed


def make_workdir() -> str:
    """A new folder for one launch, named by this process's pid; first the folders of launchers
    that died are removed."""
    sweep_stale_workdirs()
    return tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
