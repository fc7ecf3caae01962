import os
import sys

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # rank_fns, importable by spawned ranks

# tests/browser/ needs Chromium and a JupyterLab server: only `make test-browser` runs it
# (a path named on the command line is collected even so).
collect_ignore = ["browser"]


def kernel_lifetime_helpers() -> set[int]:
    """multiprocessing's forkserver and resource tracker: started by the first forkserver
    launch, they live as long as this process, as in a notebook kernel
    (tests/test_forkserver.py checks they go with it). Not leftovers of one test."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    return {p for p in pids if p}


@pytest.fixture
def no_leftover_children():
    """Fail if a test leaves a child process of this process alive (the ranks a
    forkserver started included: they are its children, so ours recursively)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    keep = before | kernel_lifetime_helpers()
    leftover = [p for p in me.children(recursive=True)
                if p.pid not in keep and p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover, f"processes left behind: {[(p.pid, p.name()) for p in leftover]}"
