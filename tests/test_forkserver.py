"""Ranks started from a preloaded forkserver: what macOS does, and Linux once forking the
kernel is unsafe (CUDA initialised, or autograd's GPU threads started by a backward).

The failure tests of tests/test_launch.py run under the forkserver too (its
``each_start_method`` fixture); here: what is particular to a forkserver.
"""
import os
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch
import torch.distributed as dist

from course_utils.runtime import launch as launch_mod
from course_utils.runtime.launch import choose_start_method, describe_plan, launch

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def test_a_function_defined_here_runs_by_value_and_sees_the_callers_env_and_folder(monkeypatch, tmp_path):
    """The server was started earlier, with the environment and folder of that moment; a
    rank still sees the caller's as they are now, as a forked rank would."""
    launch(lambda: 0, 1, quiet=True, start_method="forkserver")       # the server exists now
    monkeypatch.setenv("COURSE_SET_AFTER_THE_SERVER", "yes")
    monkeypatch.chdir(tmp_path)
    offset = 10.0                                                      # a closure, as in a cell

    def fn():
        t = torch.tensor([dist.get_rank() + offset])
        dist.all_reduce(t)
        return t.item(), os.environ.get("COURSE_SET_AFTER_THE_SERVER"), os.getcwd(), os.getppid()

    out = launch(fn, 2, quiet=True, start_method="forkserver")
    assert [o[:3] for o in out] == [(21.0, "yes", str(tmp_path))] * 2
    assert out.start_method == "forkserver"
    assert out[0][3] != os.getpid()                   # forked by the server, not by us


#: What the package adds to the preload (course_utils/__init__.py): the launcher names none of it.
ABOVE_THE_LAUNCHER = ["course_utils.harness.experiments", "course_utils.harness.model",
                      "course_utils.labs.collectives_lab", "course_utils.impl.zero3", "course_utils.harness.strategies"]


def test_the_preload_holds_torch_and_the_launcher_and_initialises_no_cuda():
    assert launch_mod.FORKSERVER_PRELOAD[:2] == ["torch", "torch.distributed"]
    assert "course_utils.runtime.launch" in launch_mod.FORKSERVER_PRELOAD
    assert launch_mod.FORKSERVER_PRELOAD[-len(ABOVE_THE_LAUNCHER):] == ABOVE_THE_LAUNCHER

    def fn():
        import sys as _sys
        return "torch" in _sys.modules, torch.cuda.is_initialized(), [m for m in ABOVE_THE_LAUNCHER
                                                                       if m not in _sys.modules]

    assert launch(fn, 1, quiet=True, start_method="forkserver") == [(True, False, [])]


def test_a_registered_module_is_preloaded_by_a_server_started_after(tmp_path):
    """``register_forkserver_preload``: each name once, in order, imported by the next server."""
    code = textwrap.dedent("""
        from course_utils.runtime.launch import FORKSERVER_PRELOAD, launch, register_forkserver_preload
        register_forkserver_preload("tabnanny", "tabnanny")
        assert FORKSERVER_PRELOAD.count("tabnanny") == 1 and FORKSERVER_PRELOAD[-1] == "tabnanny"
        try:
            register_forkserver_preload(None)
        except TypeError as exc:
            assert "dotted name" in str(exc)
        else:
            raise AssertionError("None was accepted")

        def fn():
            import sys
            return "tabnanny" in sys.modules, "pyclbr" in sys.modules

        print(launch(fn, 1, quiet=True, start_method="forkserver"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[(True, False)]"


def test_the_forkserver_goes_when_the_kernel_exits(tmp_path):
    """No process left behind: a kernel that used the forkserver and exits takes the
    server (and multiprocessing's resource tracker) with it."""
    code = textwrap.dedent("""
        import os
        from multiprocessing import forkserver, resource_tracker
        from course_utils.runtime.launch import launch
        assert launch(lambda: 1, 2, quiet=True, start_method="forkserver") == [1, 1]
        print(forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    for pid in pids:
        try:
            psutil.Process(pid).wait(timeout=10)
        except psutil.NoSuchProcess:
            pass
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_ranks_that_die_before_they_start_are_named_as_a_forkserver_failure(tmp_path):
    """A script without ``if __name__ == "__main__":`` re-runs itself in each rank (the
    forkserver imports the main module, as spawn does) and that rank dies before the
    launcher's code runs: forced, that is a LaunchError saying so, not a hang."""
    script = tmp_path / "no_main_guard.py"
    script.write_text(textwrap.dedent("""
        from course_utils.runtime.launch import launch
        launch(abs, 2, -1, quiet=True, start_method="forkserver")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "ranks could not start from a forkserver: rank" in out.stderr
    assert "before it started" in out.stderr and "start_method='spawn'" in out.stderr


def test_an_automatic_forkserver_that_fails_falls_back_to_spawn_once(monkeypatch, capsys):
    """Chosen automatically (macOS, say) and broken there: the launch is redone with spawn,
    the plan line says why, and later launches spawn at once."""
    monkeypatch.delenv("COURSE_START_METHOD", raising=False)
    monkeypatch.setattr(launch_mod, "choose_start_method",
                        lambda: "spawn" if launch_mod._forkserver_broken else "forkserver")
    monkeypatch.setattr(launch_mod, "_forkserver_broken", None)
    real = launch_mod._launch_with
    calls = []

    def failing(method, *args):
        calls.append(method)
        if method == "forkserver":
            raise launch_mod._ForkserverFailed("rank 0 died (signal 6) before it started")
        return real(method, *args)

    monkeypatch.setattr(launch_mod, "_launch_with", failing)
    assert launch(abs, 2, -3) == [3, 3]
    assert calls == ["forkserver", "spawn"]
    assert launch_mod._forkserver_broken == "the forkserver failed here: rank 0 died (signal 6) before it started"
    assert "spawned as new interpreters" in capsys.readouterr().out
    assert launch(abs, 1, -3, quiet=True) == [3] and calls[-1] == "spawn"


def test_a_temporary_folder_too_long_for_the_servers_socket_means_spawn(monkeypatch, tmp_path):
    """The forkserver listens on an AF_UNIX socket under $TMPDIR, whose path may hold 103
    bytes on macOS (107 on Linux): a longer TMPDIR would fail there, so ranks spawn and the
    plan line says how to fix it."""
    import tempfile

    deep = tmp_path / ("x" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    problem = launch_mod._forkserver_problem()
    assert problem and "too long for the forkserver's socket" in problem and "set TMPDIR" in problem
    monkeypatch.setattr(launch_mod, "gpu_count", lambda: 1)
    monkeypatch.setattr(launch_mod, "_AUTOGRAD_FORK_BROKEN", True)   # forking here is unsafe
    monkeypatch.delenv("COURSE_START_METHOD", raising=False)
    assert choose_start_method() == "spawn"
    assert "too long for the forkserver's socket" in describe_plan(2, "gloo", "spawn")
