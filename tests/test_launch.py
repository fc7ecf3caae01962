"""The launcher: results by rank, errors, hangs, interrupts, no process left behind."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import rank_fns
from course_utils.runtime.launch import (LaunchError, LaunchTimeout, RankResults, choose_start_method,
                                 describe_plan, launch, resolve_backend)

pytestmark = pytest.mark.usefixtures("no_leftover_children")


@pytest.fixture(params=["fork", "forkserver"])
def each_start_method(request, monkeypatch):
    """The failure tests, with ranks forked from here (Linux, CI) and from the forkserver
    (macOS; Linux after CUDA or a backward next to a GPU): reported the same way."""
    monkeypatch.setenv("COURSE_START_METHOD", request.param)
    return request.param


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_results_in_rank_order(world_size):
    out = launch(rank_fns.rank_and_sum, world_size, quiet=True)
    total = world_size * (world_size + 1) / 2
    assert out == [(r, total) for r in range(world_size)]
    assert isinstance(out, RankResults)
    assert out.backend == "gloo" and out.world_size == world_size


def test_notebook_defined_function_runs_when_forked():
    offset = 100  # a closure over a local: not picklable, so only fork can run it

    def local_fn():
        return dist.get_rank() + offset

    assert choose_start_method() == "fork"
    out = launch(local_fn, 3, quiet=True)
    assert out == [100, 101, 102] and out.start_method == "fork"


def test_tensors_and_nested_values_come_back():
    def fn():
        r = dist.get_rank()
        x = torch.arange(5.0, requires_grad=True) * (r + 1)  # non-leaf, needs grad
        return {"rank": r, "x": x, "pair": (torch.ones(2, dtype=torch.int64) * r, "s")}

    out = launch(fn, 2, quiet=True)
    assert torch.equal(out[1]["x"], torch.arange(5.0) * 2)
    assert not out[1]["x"].requires_grad
    assert out[0]["pair"][0].dtype == torch.int64 and out[0]["pair"][1] == "s"


def test_rank_and_world_size_parameters_are_filled_in():
    def fn(rank, world_size, scale=1):
        return rank * scale + world_size * 1000

    assert launch(fn, 3, quiet=True, scale=10) == [3000, 3010, 3020]


def test_args_and_kwargs_reach_every_rank():
    def fn(a, b=0):
        return a + b + dist.get_rank()

    assert launch(fn, 2, 5, b=7, quiet=True) == [12, 13]


def test_spawn_runs_an_importable_function():
    out = launch(rank_fns.rank_and_sum, 2, quiet=True, start_method="spawn")
    assert out == [(0, 3.0), (1, 3.0)] and out.start_method == "spawn"


def test_spawn_runs_a_local_function_by_value():
    """macOS and Windows always spawn: a function defined in a notebook cell (here a closure
    over a local, which plain pickle cannot send) still runs, with its arguments."""
    offset = 100
    scale = torch.tensor([2.0])

    def local_fn(x, rank):
        t = torch.tensor([float(rank)]) * scale
        dist.all_reduce(t)
        return t.item() + offset + x

    out = launch(local_fn, 2, 5, quiet=True, start_method="spawn")
    assert out == [107.0, 107.0] and out.start_method == "spawn"


def test_spawn_refuses_what_cannot_travel_with_a_clear_message():
    import threading

    lock = threading.Lock()

    def holds_a_lock():
        return lock.locked()

    with pytest.raises(LaunchError, match="cannot be serialised"):
        launch(holds_a_lock, 2, quiet=True, start_method="spawn")


def test_start_method_can_be_forced_from_the_environment(monkeypatch, capsys):
    from course_utils.course.exercises import check_rank_sum

    monkeypatch.setenv("COURSE_START_METHOD", "spawn")
    assert choose_start_method() == "spawn"

    def rank_sum():                       # a learner's answer, defined in the "notebook"
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return t

    assert check_rank_sum(rank_sum)                 # graders print no launch line...
    assert launch(rank_sum, 2).start_method == "spawn"
    assert "spawned as new interpreters" in capsys.readouterr().out     # ...a launch does
    monkeypatch.setenv("COURSE_START_METHOD", "forkserver")
    assert choose_start_method() == "forkserver"
    assert launch(rank_sum, 2).start_method == "forkserver"
    assert ("forked from a preloaded forkserver (COURSE_START_METHOD=forkserver)"
            in capsys.readouterr().out)
    monkeypatch.setenv("COURSE_START_METHOD", "fork-server")
    with pytest.raises(ValueError, match="COURSE_START_METHOD must be one of fork, forkserver, spawn"):
        choose_start_method()


def test_a_backward_next_to_a_gpu_makes_ranks_start_from_the_forkserver(monkeypatch):
    """On an H200 with torch 2.11, a backward in the caller (even on the CPU) started
    autograd's GPU threads, and every forked rank then failed its first backward
    ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"): the launcher must not fork the caller then, and uses the forkserver
    (a fresh process: the caller's threads are not in it). Here (no GPU) the probe is
    stood in."""
    from course_utils.runtime import launch as launch_mod

    monkeypatch.delenv("COURSE_START_METHOD", raising=False)
    x = torch.ones(2, requires_grad=True)
    (x * x).sum().backward()
    if launch_mod.gpu_count():      # measured on the H200: the probe sees it
        assert not launch_mod.autograd_survives_fork() and choose_start_method() == "forkserver"
        return
    assert launch_mod.autograd_survives_fork()          # no GPU threads on this machine
    assert choose_start_method() == "fork"
    monkeypatch.setattr(launch_mod, "gpu_count", lambda: 1)
    assert choose_start_method() == "fork"              # the real probe: still fine here
    monkeypatch.setattr(launch_mod, "_AUTOGRAD_FORK_BROKEN", True)
    assert not launch_mod.autograd_survives_fork()
    assert choose_start_method() == "forkserver"
    assert describe_plan(2, "gloo", "forkserver") == (
        "launch: 2 ranks, gloo on CPU, forked from a preloaded forkserver "
        "(a backward ran here next to a GPU: forked ranks could not run one)")
    monkeypatch.setattr(launch_mod, "gpu_count", lambda: 0)
    assert choose_start_method() == "fork"              # without a GPU, never asked


def test_gloo_connected_lines_are_not_rank_output(tmp_path):
    # torch 2.9 and 2.10: gloo writes this line to every rank's stdout once connected
    path = tmp_path / "rank0.out"
    path.write_bytes(b"[Gloo] Rank 0 is connected to 3 peer ranks. Expected number of "
                     b"connected peer ranks is : 3\nhello\n[Gloo] is mine\n")
    from course_utils.runtime.launch import _read
    assert _read(str(path)) == "hello\n[Gloo] is mine\n"
    assert _read(str(tmp_path / "missing")) == ""


def test_output_is_printed_in_rank_order_with_prefix(capsys):
    def fn():
        for turn in (3, 2, 1, 0):                 # print in reverse rank order
            if dist.get_rank() == turn:
                print(f"hello from {turn}")
                print("warned", file=sys.stderr)
            dist.barrier()

    launch(fn, 4)
    out, err = capsys.readouterr()
    assert out.splitlines() == [describe_plan(4, "gloo", "fork")] + [
        f"[rank {r}] hello from {r}" for r in range(4)]
    assert [line for line in err.splitlines() if "warned" in line] == [
        f"[rank {r}] warned" for r in range(4)]


@pytest.mark.usefixtures("each_start_method")
def test_rank_that_raises_is_reported_within_seconds():
    def fn():
        if dist.get_rank() == 1:
            raise ValueError("bad batch on rank 1")
        dist.all_reduce(torch.ones(1))  # the others wait here forever

    with pytest.raises(LaunchError) as info:
        launch(fn, 4, quiet=True, timeout_s=60)
    err = info.value
    assert not isinstance(err, LaunchTimeout)        # reported when it failed, not at the timeout
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank 1" in str(err) and "ValueError" in str(err) and "bad batch on rank 1" in str(err)
    assert "Traceback" in err.rank_traceback


@pytest.mark.usefixtures("each_start_method")
def test_every_rank_raising_reports_the_lowest_rank():
    def fn():
        raise RuntimeError("same everywhere")

    for _ in range(3):
        with pytest.raises(LaunchError) as info:
            launch(fn, 4, quiet=True)
        assert info.value.rank == 0


def test_the_lower_rank_raising_later_is_reported(tmp_path):
    """The rank reported does not depend on time: rank 1 raises first, rank 0 over a second
    later (rank 1's message waits for it, so the launcher has not stopped rank 0 by then),
    and rank 0's own error is the one reported."""
    raised, later = tmp_path / "rank1-raised", tmp_path / "rank0-raising"

    class SaidOnceRankZeroRaised(Exception):
        def __str__(self):                  # the launcher reads the message as the rank fails
            _until(later.exists, "rank 0's error")
            return "rank 1 raised first"

    def fn(rank):
        if rank == 1:
            raised.touch()
            raise SaidOnceRankZeroRaised()
        _until(raised.exists, "rank 1's error")
        time.sleep(1.5)   # a gap, not a synchronisation: later than the 1 s window once used
        later.touch()
        raise ValueError("rank 0 raised later")

    with pytest.raises(LaunchError) as info:
        launch(fn, 2, quiet=True, timeout_s=60)
    assert info.value.rank == 0 and info.value.exc_type == "ValueError"
    assert "rank 0 raised ValueError: rank 0 raised later" in str(info.value)


def test_the_reported_rank_goes_by_cause_then_rank():
    """An error of its own, then a crash (no Python error, before the launcher stopped
    anyone), then an error from a peer's death, then a rank the launcher stopped; the
    lowest rank among equals."""
    from course_utils.runtime.launch import _first_failure

    own = {"type": "ValueError", "message": "bad batch"}
    peer = {"type": "RuntimeError", "message": "[gloo/transport/tcp/pair.cc:534] Connection closed by peer"}
    reset = {"type": "DistBackendError", "message": "Connection reset by peer"}
    assert _first_failure({0: peer, 2: own, 3: own}, [1, None, 1, 1], [0, 1, 2, 3]) == 2
    assert _first_failure({0: peer, 1: reset}, [1, 1, -9, None], [0, 1, 2, 3]) == 2
    assert _first_failure({1: reset, 2: peer}, [None, 1, 1, None], [0, 1, 2, 3]) == 1
    assert _first_failure({}, [None, 0, None], [0, 2]) == 0
    assert _first_failure({}, [0, 0], []) is None


@pytest.mark.usefixtures("each_start_method")
def test_hanging_rank_is_killed_at_the_timeout():
    def fn():
        if dist.get_rank() == 2:
            time.sleep(600)
        dist.barrier()

    t0 = time.perf_counter()
    with pytest.raises(LaunchTimeout) as info:
        launch(fn, 4, quiet=True, timeout_s=2)
    assert time.perf_counter() - t0 >= 2              # killed at the timeout, not before
    assert info.value.rank is not None
    assert "timeout_s=2" in str(info.value)
    assert "in fn" in str(info.value)  # where each rank was stuck


@pytest.mark.usefixtures("each_start_method")
def test_crashing_rank_without_python_error_is_reported():
    def fn():
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return 1

    with pytest.raises(LaunchError) as info:
        launch(fn, 2, quiet=True, timeout_s=20)
    assert info.value.rank == 1 and "signal 9" in str(info.value)


@pytest.mark.usefixtures("each_start_method")
def test_unpicklable_return_value_is_a_clear_error():
    def fn():
        return lambda: 0

    with pytest.raises(LaunchError, match="cannot be pickled"):
        launch(fn, 2, quiet=True)


@pytest.mark.usefixtures("each_start_method")
def test_ten_launches_in_a_row():
    for i in range(10):
        assert launch(rank_fns.rank_and_sum, 2, quiet=True) == [(0, 3.0), (1, 3.0)]


@pytest.mark.usefixtures("each_start_method")
def test_env_reaches_the_ranks():
    def fn():
        return os.environ["COURSE_TEST_VAR"], os.environ["WORLD_SIZE"], torch.get_num_threads()

    assert launch(fn, 2, quiet=True, env={"COURSE_TEST_VAR": "x"}) == [("x", "2", 1)] * 2


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(world_size=0), ValueError, "world_size must be >= 1"),
    (dict(world_size="4"), TypeError, "world_size must be an int"),
    (dict(world_size=2, backend="mpi"), ValueError, "backend must be one of"),
    (dict(world_size=2, backend="nccl"), ValueError, "one GPU per rank"),
    (dict(world_size=2, timeout_s=0), ValueError, "timeout_s must be a positive"),
    (dict(world_size=2, start_method="fork-server"), ValueError, "start_method must be"),
    (dict(world_size=2, env={"A": 1}), TypeError, "env must be a dict"),
])
def test_bad_arguments_get_clear_errors(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        launch(rank_fns.rank_and_sum, quiet=True, **kwargs)


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        launch("not a function", 2)


def test_auto_backend_uses_nccl_only_with_a_gpu_per_rank(monkeypatch):
    import course_utils.runtime.launch as L

    monkeypatch.setattr(L, "gpu_count", lambda: 0)
    assert resolve_backend(4) == "gloo"
    monkeypatch.setattr(L, "gpu_count", lambda: 2)
    assert resolve_backend(2) == "nccl" and resolve_backend(4) == "gloo"
    assert resolve_backend(4, "gloo") == "gloo"


def _script(body: str, tmp_path, start_method: str = "fork") -> subprocess.Popen:
    # Python ignores SIGINT if it started ignored (a job started with `&`, as CI may be):
    # handle it as a notebook kernel does, whatever this process inherited.
    code = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import rank_fns
        from course_utils.runtime.launch import launch
        {body}
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COURSE_START_METHOD=start_method))


def _until(condition, what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout:g} s"
        time.sleep(0.001)


def _wait_for_pids(pid_dir, n, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = list(pid_dir.glob("*.pid"))
        if len(files) == n and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError("ranks did not start")


def _all_gone(pids, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_interrupt_kills_the_ranks(tmp_path, start_method):
    """The kernel's Stop button sends SIGINT: the launch stops and no rank survives."""
    proc = _script(f"launch(rank_fns.write_pid_then_sleep, 3, {str(tmp_path)!r}, timeout_s=300)", tmp_path,
                   start_method)
    pids = _wait_for_pids(tmp_path, 3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt: launch interrupted: all 3 ranks were stopped" in err
    assert _all_gone(pids), "a rank survived the interrupt"


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_ranks_die_with_a_killed_parent(tmp_path, start_method):
    """A kernel killed outright: its forked ranks die with it; under a forkserver, the
    server sees its parent gone and exits, and the ranks die with the server."""
    proc = _script(f"launch(rank_fns.write_pid_then_sleep, 2, {str(tmp_path)!r}, timeout_s=300)", tmp_path,
                   start_method)
    pids = _wait_for_pids(tmp_path, 2)
    proc.kill()
    proc.communicate(timeout=30)
    assert _all_gone(pids), "a rank outlived its killed parent"
    left = glob.glob(os.path.join(tempfile.gettempdir(), f"course-launch-{proc.pid}-*"))
    assert left, "the killed launch left no work directory: the next assertion tests nothing"
    live = tempfile.mkdtemp(prefix=f"course-launch-{os.getpid()}-")     # a live launcher's
    try:
        launch(rank_fns.rank_and_sum, 1, quiet=True)
        assert not any(os.path.exists(d) for d in left), "the next launch left a dead launch's directory"
        assert os.path.isdir(live), "the next launch removed a live launcher's directory"
    finally:
        shutil.rmtree(live, ignore_errors=True)


@pytest.mark.parametrize("world_size,start_method", [(4, "fork"), (2, "forkserver"), (2, "spawn")])
def test_a_launch_listens_on_loopback_only(world_size, start_method):
    """A demo opens nothing to the network: no rendezvous store listening on every
    interface (the ranks meet through a file), and gloo's sockets on loopback."""
    import ipaddress

    out = launch(rank_fns.sockets_after_a_collective, world_size, quiet=True,
                 start_method=start_method)
    for rank, conns in enumerate(out):
        listening = [ip for status, ip in conns if status == psutil.CONN_LISTEN]
        assert listening, f"rank {rank}: gloo should listen for its peers (on loopback)"
        outside = [ip for ip in listening if not ipaddress.ip_address(ip.split("%")[0]).is_loopback]
        assert not outside, f"rank {rank} listens beyond loopback on {outside}"
        peers = [ip for status, ip in conns if status == psutil.CONN_ESTABLISHED]
        assert world_size == 1 or peers, f"rank {rank}: no gloo connection seen"


def test_an_interrupt_while_ranks_start_is_held_until_all_are_started():
    """Ctrl-C inside Process.start(), after its fork, would orphan that rank: it is held
    and raised once the ranks are started; where SIGINT is ignored, it stays ignored."""
    from course_utils.runtime.launch import _held_interrupts, _interrupts_held

    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a kernel
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with _interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
                _until(lambda: _held_interrupts, "the held SIGINT")   # the handler has run
                reached.append("after the signal")
        assert reached == ["after the signal"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with _interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)       # ignored: discarded when sent, nothing to wait for
            assert not _held_interrupts and signal.SIGINT not in getattr(signal, "sigpending", set)()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_fork_probe_kills_a_child_that_hangs(monkeypatch):
    """A probe child whose backward deadlocks (as autograd's threads can after a fork) must
    not hang the caller: it is killed after FORK_PROBE_TIMEOUT_S and counts as broken."""
    import time

    from course_utils.runtime import launch as launch_mod

    monkeypatch.setattr(launch_mod, "_AUTOGRAD_FORK_BROKEN", False)
    monkeypatch.setattr(launch_mod, "_FORK_PROBE_PASSED", None)
    monkeypatch.setattr(launch_mod, "FORK_PROBE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: time.sleep(3600))
    start = time.monotonic()
    assert not launch_mod.autograd_survives_fork()
    assert time.monotonic() - start < 30          # killed, not waited for (a bound, not a timing)
    assert launch_mod._AUTOGRAD_FORK_BROKEN


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads are listed from /proc (Linux)")
def test_the_fork_probes_answer_is_kept_both_ways(monkeypatch):
    """The probe forks once per process: a False is kept for good; a True while no thread
    has started here since (autograd's device threads, what breaks forking, are new ones)."""
    import threading

    from course_utils.runtime import launch as launch_mod

    monkeypatch.setattr(launch_mod, "_AUTOGRAD_FORK_BROKEN", False)
    monkeypatch.setattr(launch_mod, "_FORK_PROBE_PASSED", None)
    forks, real_fork = [], os.fork

    def counted_fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counted_fork)
    assert launch_mod.autograd_survives_fork() and len(forks) == 1
    assert launch_mod.autograd_survives_fork() and len(forks) == 1          # kept
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="a-new-thread")
    thread.start()
    try:
        assert launch_mod.autograd_survives_fork() and len(forks) == 2      # a new thread: asked again
        assert launch_mod.autograd_survives_fork() and len(forks) == 2
    finally:
        stop.set()
        thread.join()
    assert launch_mod.autograd_survives_fork() and len(forks) == 2          # fewer threads: still kept
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "backward", lambda self, *a, **k: 1 / 0)   # the child's backward fails
        m.setattr(launch_mod, "_FORK_PROBE_PASSED", None)
        assert not launch_mod.autograd_survives_fork() and len(forks) == 3
    assert not launch_mod.autograd_survives_fork() and len(forks) == 3      # kept, even with backward back
