import os
import sys

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # rank_fns, importable by spawned ranks


@pytest.fixture
def no_leftover_children():
    """Fail if a test leaves a child process of this process alive."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    leftover = [p for p in me.children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover, f"processes left behind: {[(p.pid, p.name()) for p in leftover]}"
