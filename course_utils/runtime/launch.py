"""Run a function on N real processes, one per rank: the course's launcher (notebook 00).

Every multi-process demo (and ``%%ranks``) goes through :func:`launch`. Ranks are *forked*
on Linux while CUDA and autograd's GPU threads are not started here (0.1 s for 4 ranks), else
forked from a *forkserver* that preloaded torch (first launch ~4 s), else (Windows) *spawned*;
those two get ``fn`` by value (``cloudpickle``). A failing rank fails the launch at once, a hung
one is killed at ``timeout_s``, no child outlives the call, nothing listens on the network.
"""
from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import inspect
import io
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from typing import Callable

from ..checks import check_int, check_timeout
from .fmt import plural
from .stacks import dump_hung_stacks, user_stacks
from .workdir import make_workdir

__all__ = ["launch", "LaunchError", "LaunchTimeout", "RankResults", "resolve_backend",
           "choose_start_method", "START_METHODS", "FORKSERVER_PRELOAD", "register_forkserver_preload",
           "autograd_survives_fork", "rank_device", "describe_plan", "backend_label", "where",
           "loopback_interface", "gpu_count"]

BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_TIMEOUT_S = 60.0
#: Seconds the process group's timeout exceeds ``launch``'s ``timeout_s`` (see :func:`launch`).
PG_TIMEOUT_GRACE_S = 10.0
_KILL_GRACE_S = 1.0


class LaunchError(RuntimeError):
    """A rank failed (raised, crashed or hung). ``rank`` is the one reported: a cause before a
    consequence (an error of its own, then a crash, then a peer's death, then stopped by the
    launcher), the lowest among equals; for a hang, the lowest still running."""

    def __init__(self, message: str, *, rank: int | None, exc_type: str | None = None,
                 rank_traceback: str = "", outputs: dict[int, str] | None = None,
                 signal: int | None = None, stacks: dict[int, str] | None = None,
                 results: dict | None = None, moving: set | None = None, cpu_measured: bool = False):
        super().__init__(message)
        self.rank, self.exc_type, self.rank_traceback = rank, exc_type, rank_traceback
        self.outputs = outputs or {}
        #: the signal that killed ``rank`` (e.g. 6: gloo aborted it), else None
        self.signal = signal
        #: a hang: each hung rank's Python stack (innermost first, the launcher's frames cut)
        self.stacks = stacks or {}
        #: a hang: the values of the ranks that had returned before the others were killed
        self.results = results or {}
        #: a hang: the hung ranks still running (not waiting): their two stack dumps, 0.3 s apart,
        #: differ, or they used CPU meanwhile
        self.moving = moving or set()
        #: whether ``moving`` includes the ranks that used CPU (Linux), not only changed stacks
        self.cpu_measured = cpu_measured


class LaunchTimeout(LaunchError):
    """Some ranks were still running at ``timeout_s`` and were killed."""


class RankResults(list):
    """Return values by rank, with ``.backend``, ``.start_method``, ``.world_size``, ``.outputs``."""


# --------------------------------------------------------------------------- planning

def gpu_count() -> int:
    """CUDA GPUs visible, counted without initialising CUDA here (``device_count()`` asks NVML;
    ``is_available()`` would init the driver and forked ranks lose the GPU): the one GPU check."""
    import torch
    return torch.cuda.device_count()


def resolve_backend(world_size: int, backend: str = "auto") -> str:
    """The backend ``launch`` uses: ``"auto"`` is ``"nccl"`` with one GPU per rank, else ``"gloo"``."""
    check_int("world_size", world_size, 1)
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: {plural(world_size, 'rank')} but "
            f"{plural(gpus, 'GPU')} visible. Use backend='gloo' (CPU) or fewer ranks."
        )
    return backend


START_METHOD_ENV = "COURSE_START_METHOD"    # overrides the automatic start method
START_METHODS = ("fork", "forkserver", "spawn")
#: What the forkserver imports once, so ranks start like forked ones (FSDP alone: ~0.9 s per
#: rank). Nothing that initialises CUDA, nor DeepSpeed (it probes the accelerator). The layers
#: above add their own modules with :func:`register_forkserver_preload` (the package's
#: ``__init__`` does, on import): this module names none of them.
FORKSERVER_PRELOAD = [
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor",
    "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
    "torch.nn.parallel", "torch._dynamo", "numpy.random", "cloudpickle",  # the optimizers' step imports dynamo
    __name__,
]


def register_forkserver_preload(*modules: str) -> None:
    """Add ``modules`` (dotted names) to :data:`FORKSERVER_PRELOAD`, each once, in order. A
    forkserver imports the list when it starts (the first launch that uses one): a module
    added later reaches only a server started later."""
    for name in modules:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a module to preload is a dotted name (str), got {name!r}")
        if name not in FORKSERVER_PRELOAD:
            FORKSERVER_PRELOAD.append(name)


#: The longest AF_UNIX socket path (104 bytes on macOS/BSD); the forkserver listens on
#: ``$TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX``.
_SUN_PATH_MAX = 108 if sys.platform.startswith("linux") else 104
_forkserver_broken: str | None = None      # why the forkserver failed here, once it has


def _available(method: str) -> bool:
    return method in mp.get_all_start_methods()


def _check_method(name: str, method, allowed=START_METHODS) -> None:
    """``method`` is one of ``allowed`` and, unless ``"auto"``, a start method this platform has."""
    if method not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {method!r}")
    if method != "auto" and not _available(method):
        raise ValueError(f"{name}={method}: this platform ({sys.platform}) has no {method} start "
                         "method; use spawn")


def choose_start_method() -> str:
    """``"fork"`` on Linux while CUDA is not initialised and (with a GPU) :func:`autograd_survives_fork`,
    else ``"forkserver"``, else ``"spawn"``; ``COURSE_START_METHOD`` overrides."""
    forced = os.environ.get(START_METHOD_ENV, "").strip()
    if forced:
        _check_method(START_METHOD_ENV, forced)
        return forced
    import torch
    if sys.platform.startswith("linux") and not torch.cuda.is_initialized() and \
            (gpu_count() == 0 or autograd_survives_fork()):
        return "fork"
    if _available("forkserver") and _forkserver_problem() is None:
        return "forkserver"
    return "spawn"


def _forkserver_problem() -> str | None:
    """Why a forkserver cannot be used here, or None."""
    if _forkserver_broken:
        return _forkserver_broken
    need = len(tempfile.gettempdir()) + len("/pymp-XXXXXXXX/listener-XXXXXXXX")
    if need >= _SUN_PATH_MAX:
        return (f"the temporary folder's path is too long for the forkserver's socket "
                f"({need} of {_SUN_PATH_MAX - 1} bytes: set TMPDIR to a short folder, e.g. /tmp)")


_AUTOGRAD_FORK_BROKEN = False       # once broken in this process, it stays broken
#: (pid, thread ids) of the last probe that passed: its answer holds while no thread started since
_FORK_PROBE_PASSED: tuple | None = None
FORK_PROBE_TIMEOUT_S = 10.0         # a probe child still running then is killed: "broken"


def _thread_ids() -> frozenset | None:
    """This process's OS threads (Linux: ``/proc/self/task``), or None where unknown."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:
        return None


def autograd_survives_fork() -> bool:
    """Whether a process forked from this one can run a backward: with a GPU visible, a child
    forked after the first backward refuses every backward (H200, torch 2.11). Asked once per
    process, by forking a child that runs one: a False is kept; a True is kept while no thread
    has started here since (what breaks it, autograd's device threads, are new threads that
    never end), else the child is forked again (where threads cannot be listed: every time)."""
    global _AUTOGRAD_FORK_BROKEN, _FORK_PROBE_PASSED
    if _AUTOGRAD_FORK_BROKEN:
        return False
    threads = _thread_ids()
    if (threads is not None and _FORK_PROBE_PASSED is not None and _FORK_PROBE_PASSED[0] == os.getpid()
            and threads <= _FORK_PROBE_PASSED[1]):
        return True
    pid = os.fork()
    if pid == 0:                                     # the child: try, report, leave at once
        try:
            import torch
            (2 * torch.zeros(1, requires_grad=True)).sum().backward()
        except BaseException:  # noqa: BLE001 - any failure means "do not fork"
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + FORK_PROBE_TIMEOUT_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    if done[0] == 0:                                 # deadlocked: kill it, reap it
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    ok = done[0] != 0 and os.waitstatus_to_exitcode(done[1]) == 0
    _AUTOGRAD_FORK_BROKEN = not ok
    _FORK_PROBE_PASSED = (os.getpid(), threads) if ok and threads is not None else None
    return ok


def backend_label(backend: str) -> str:
    """Where ranks of this backend compute, in words."""
    return "NCCL, one GPU per rank" if backend == "nccl" else "gloo on CPU"


def where(ranks, backend: str | None = None, *, backend_first: bool = False) -> str:
    """Where ``ranks`` (a :class:`RankResults`, or a world size with its ``backend``) ran:
    ``"2 ranks, gloo on CPU"``; ``backend_first=True``: ``"2 gloo ranks on CPU"``,
    ``"2 NCCL ranks, one GPU each"``."""
    n = ranks if isinstance(ranks, int) else len(ranks)
    if backend is None:
        if isinstance(ranks, int):
            raise TypeError("where(world_size, backend): a world size needs its backend")
        backend = ranks.backend
    if backend_first:
        return (plural(n, "NCCL rank") + ", one GPU each" if backend == "nccl"
                else plural(n, "gloo rank") + " on CPU")
    return f"{plural(n, 'rank')}, {backend_label(backend)}"


def _why(method: str) -> str:
    """Why ranks are not forked from this process (for spawn: and why no forkserver)."""
    forced = os.environ.get(START_METHOD_ENV, "").strip()
    if forced in ("forkserver", "spawn"):
        return f"{START_METHOD_ENV}={forced}"
    import torch
    if not sys.platform.startswith("linux"):
        why = f"{sys.platform} cannot fork a kernel safely" if _available("fork") else f"{sys.platform} cannot fork"
    elif torch.cuda.is_initialized():
        why = "CUDA is initialised in this process"
    elif _AUTOGRAD_FORK_BROKEN:
        why = "a backward ran here next to a GPU: forked ranks could not run one"
    else:
        why = "asked for"
    problem = method == "spawn" and ("no forkserver on this platform" if not _available("forkserver")
                                     else _forkserver_problem())
    return f"{why}; {problem}" if problem else why


_HOW = {"fork": "forked from this process",
        "forkserver": "forked from a preloaded forkserver",
        "spawn": "spawned as new interpreters"}


def describe_plan(world_size: int, backend: str, method: str, why: str | None = None) -> str:
    """The line ``launch`` prints: ranks, backend, how they start and (unless forked) why."""
    if method not in _HOW:
        raise ValueError(f"method must be one of {START_METHODS}, got {method!r}")
    if why is None and method != "fork":
        why = _why(method)
    return f"launch: {where(world_size, backend)}, {_HOW[method]}" + (f" ({why})" if why else "")


def rank_device():
    """The ``torch.device`` this rank should compute on (inside a launched rank)."""
    import torch
    if os.environ.get("COURSE_BACKEND") == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def loopback_interface() -> str | None:
    """The loopback interface's name (``"lo"``, ``"lo0"`` on macOS), or None (Windows)."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):  # pragma: no cover - platform without if_nameindex
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


# ------------------------------------------------------------------------- the rank side

@dataclasses.dataclass
class _Config:
    world_size: int
    backend: str
    timeout_s: float
    workdir: str
    env: dict
    #: forkserver: the caller's environment and folder now, so a rank sees what a forked one would
    caller_env: dict | None = None
    caller_cwd: str | None = None


def _die_with_parent() -> None:
    """End this rank when its parent dies (macOS lacks PR_SET_PDEATHSIG: a thread watches)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):       # best effort only
            import ctypes
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    elif os.name == "posix":
        parent = os.getppid()
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)
        threading.Thread(target=watch, name="course-watch-parent", daemon=True).start()


def _to_portable(value):
    """Tensors to detached CPU tensors (recursively), so any process can unpickle them."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return type(value)((k, _to_portable(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        items = [_to_portable(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _write_atomic(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _by_value(fn: Callable, args: tuple, rank_kwargs: list, method: str) -> bytes:
    """``fn``, ``args`` and every rank's kwargs, by value with ``cloudpickle``: a spawned or
    forkserver rank lacks the notebook's definitions, which plain pickle only names."""
    why = _why(method)
    try:
        import cloudpickle
    except ImportError:
        raise LaunchError(f"ranks are {_HOW[method]} here ({why}) and need cloudpickle to "
                          "receive fn: pip install cloudpickle", rank=None) from None
    try:
        return cloudpickle.dumps((fn, args, rank_kwargs))
    except Exception as exc:
        raise LaunchError(
            f"ranks are {_HOW[method]} here ({why}), so fn and its arguments are sent to "
            f"them by value, but {getattr(fn, '__qualname__', fn)!r} or an argument cannot "
            f"be serialised ({type(exc).__name__}: {exc}). Pass plain values and tensors, "
            "and leave out what belongs to this process (open files, locks, sockets).",
            rank=None,
        ) from None


def _rank_main(rank: int, cfg: _Config, fn: Callable, args: tuple, kwargs: dict) -> None:
    if signal.getsignal(signal.SIGINT) is _hold_interrupt:  # forked inside _interrupts_held
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if cfg.caller_env is not None:                  # forked by the forkserver
        from .compat import release_forkserver_pipe
        release_forkserver_pipe()
        os.environ.clear()
        os.environ.update(cfg.caller_env)
        with contextlib.suppress(OSError):
            os.chdir(cfg.caller_cwd)
    _die_with_parent()
    base = os.path.join(cfg.workdir, f"rank{rank}")
    open(base + ".started", "wb").close()           # tells a rank that never ran from one that failed
    for fd, ext in ((1, ".out"), (2, ".err")):      # fds 1/2 and sys.stdout/err to per-rank files
        with open(base + ext, "wb", buffering=0) as f:
            os.dup2(f.fileno(), fd)
    sys.stdout, sys.stderr = (io.TextIOWrapper(os.fdopen(fd, "wb", buffering=0, closefd=False),
                                               encoding="utf-8", line_buffering=True, write_through=True)
                              for fd in (1, 2))
    if hasattr(signal, "SIGUSR1"):  # the launcher asks a hung rank for its stack
        faulthandler.register(signal.SIGUSR1, file=open(base + ".stack", "wb", buffering=0),
                              all_threads=False)
    code = 0
    try:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(cfg.world_size),
                          LOCAL_WORLD_SIZE=str(cfg.world_size), GROUP_RANK="0", OMP_NUM_THREADS="1",
                          COURSE_BACKEND=cfg.backend)
        if (lo := loopback_interface()) is not None:   # else gloo binds to the host name's address (LAN)
            os.environ["GLOO_SOCKET_IFNAME"] = lo
        os.environ.update(cfg.env)
        import torch
        import torch.distributed as dist
        # One intra-op thread per rank: 4 ranks on 2 cores ran ~30x faster, results core-independent.
        torch.set_num_threads(1)
        # torch read TORCH_DISTRIBUTED_DEBUG when the parent imported it, before env= applied
        dist.set_debug_level_from_env()
        device_id = None
        if cfg.backend == "nccl":  # rank r computes on GPU r (what rank_device() returns)
            device_id = torch.device("cuda", rank)
            torch.cuda.set_device(device_id)
        from .wire import ignore_inherited_sockets
        ignore_inherited_sockets()   # the caller's sockets are not this rank's traffic
        # A file store in the private folder: no TCP store listening on every interface.
        store = dist.FileStore(os.path.join(cfg.workdir, "store"), cfg.world_size)
        # device_id: NCCL builds its communicator now (fails here, not in fn), barriers on this GPU
        dist.init_process_group(cfg.backend, store=store, rank=rank, world_size=cfg.world_size,
                                timeout=timedelta(seconds=cfg.timeout_s + PG_TIMEOUT_GRACE_S),
                                device_id=device_id)
        # Wait for every rank's group: else a rank failing at once exits while a peer still connects
        # its gloo mesh, and the peer's error is reported (seen in CI).
        store.set(f"course-ready-{rank}", "1")
        store.wait([f"course-ready-{r}" for r in range(cfg.world_size)])
        if isinstance(fn, bytes):                  # sent by value: _by_value
            fn, args, kwargs = pickle.loads(fn)
            kwargs = kwargs[rank]
        result = fn(*args, **kwargs)
        try:
            payload = pickle.dumps(_to_portable(result))
        except Exception as exc:
            raise TypeError(f"rank {rank} returned a {type(result).__name__} that cannot be pickled "
                            f"({exc}); return plain Python values or tensors") from exc
        _write_atomic(base + ".result", payload)
        if dist.is_initialized():  # fn may have torn the group down itself
            dist.barrier()
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        code = 1
        info = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
        with contextlib.suppress(Exception):
            _write_atomic(base + ".error", pickle.dumps(info))
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


# ----------------------------------------------------------------------- the parent side

def _wants(fn: Callable, name: str) -> bool:
    try:
        p = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


#: The line gloo writes to each rank's stdout once connected (torch 2.9, 2.10): a log, not output.
_GLOO_CONNECTED = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
                             r"Expected number of connected peer ranks is : \d+\r?\n?", re.MULTILINE)


def _read(path: str) -> str:
    """What a rank wrote to ``path``, less gloo's "connected" log lines."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return _GLOO_CONNECTED.sub("", text)


_COMM_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError")
_COMM_WORDS = ("Connection closed by peer", "Connection reset", "gloo/transport", "Broken pipe")
#: After a rank fails, seconds the others get to exit by themselves; each rank that does
#: buys the rest as long again (a loaded machine schedules ranks late), up to the max.
_FAILURE_GRACE_S = 0.5
_FAILURE_GRACE_MAX_S = 5.0


def _peer_died(failure: dict) -> bool:
    """Whether a rank's error is what a rank gets when a peer died (connection closed or reset)."""
    return failure["type"] in _COMM_ERRORS or any(w in failure["message"] for w in _COMM_WORDS)


def _first_failure(failures: dict, codes: list, missing: list) -> int | None:
    """The rank a failed launch reports, by cause and then rank, never by time: the lowest rank
    that raised an error of its own; else the lowest that died without a Python error before
    the launcher stopped anyone (a signal, ``os._exit``); else the lowest whose error came from
    a peer dying; else the lowest without a result (stopped by the launcher); None if none failed.
    ``failures``: rank -> its error; ``codes``: exit codes before the launcher stopped anyone."""
    own = [r for r, f in failures.items() if not _peer_died(f)]
    crashed = [r for r, c in enumerate(codes) if c and r not in failures]
    for ranks in (own, crashed, list(failures), missing):
        if ranks:
            return min(ranks)
    return None


_held_interrupts: list = []
_hold_interrupt = lambda signum, frame: _held_interrupts.append(signum)  # noqa: E731 - a SIGINT handler


@contextlib.contextmanager
def _interrupts_held():
    """Hold back Ctrl-C while ranks start (raised inside ``Process.start()`` after its fork,
    it would orphan a rank) and raise it once all are started, so the launch stops them.
    Where SIGINT is ignored or not handled by Python, nothing changes."""
    if (threading.current_thread() is not threading.main_thread()
            or not callable(signal.getsignal(signal.SIGINT))):
        yield
        return
    _held_interrupts.clear()
    previous = signal.signal(signal.SIGINT, _hold_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if _held_interrupts:
        _held_interrupts.clear()
        raise KeyboardInterrupt


def _stop(procs: list) -> None:
    """Terminate every live rank, SIGKILL stragglers, and reap them all."""
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        with contextlib.suppress(Exception):
            p.terminate()
    deadline = time.monotonic() + _KILL_GRACE_S
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.kill()
        p.join()
        with contextlib.suppress(Exception):
            p.close()


def launch(fn: Callable, world_size: int, *args, backend: str = "auto",
           timeout_s: float = DEFAULT_TIMEOUT_S, env: dict | None = None,
           quiet: bool = False, start_method: str = "auto", **kwargs) -> RankResults:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks, the default process group
    initialised, ``rank``/``world_size`` parameters filled in; its values by rank (tensors on CPU).

    ``timeout_s``: ranks still running then are killed (:class:`LaunchTimeout`); the process
    group's timeout is :data:`PG_TIMEOUT_GRACE_S` longer, so that a hung collective is still
    waiting (its stack shows where) when the launcher stops it, not failing on its own at the
    same moment. ``env``: extra environment variables for the ranks.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (a function each rank runs), got {type(fn).__name__}")
    check_int("world_size", world_size, 1)
    check_timeout(timeout_s)
    if env is not None and not (isinstance(env, dict)
                                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError("env must be a dict of str -> str environment variables")
    chosen = resolve_backend(world_size, backend)
    _check_method("start_method", start_method, ("auto",) + START_METHODS)
    automatic = start_method == "auto" and not os.environ.get(START_METHOD_ENV, "").strip()
    method = choose_start_method() if start_method == "auto" else start_method
    why = None if start_method == "auto" or method == "fork" else f"start_method={method!r}"
    try:
        return _launch_with(method, fn, world_size, chosen, args, kwargs, timeout_s, env, quiet, why)
    except _ForkserverFailed as failed:
        global _forkserver_broken
        _forkserver_broken = f"the forkserver failed here: {failed}"
        if not automatic:
            raise LaunchError(f"ranks could not start from a forkserver: {failed}. "
                              "Use start_method='spawn' (or COURSE_START_METHOD=spawn).", rank=None) from None
    # outside the except clause: _launch_with cleans up differently while an exception is live
    return _launch_with("spawn", fn, world_size, chosen, args, kwargs, timeout_s, env, quiet)


class _ForkserverFailed(Exception):
    """The forkserver could not start, or its ranks died before running a line of ours."""


def _wait(procs: list, timeout: float) -> int:
    """Wait up to ``timeout`` for a running rank to exit; how many still run."""
    running = [p.sentinel for p in procs if p.exitcode is None]
    if running and timeout > 0:
        mp.connection.wait(running, timeout=timeout)
    return sum(p.exitcode is None for p in procs)


def _load(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def _launch_with(method: str, fn: Callable, world_size: int, chosen: str, args: tuple,
                 kwargs: dict, timeout_s: float, env: dict | None, quiet: bool,
                 why: str | None = None) -> RankResults:
    if not quiet:
        print(describe_plan(world_size, chosen, method, why), flush=True)
    rank_kwargs = [{**({"rank": r} if _wants(fn, "rank") else {}),
                    **({"world_size": world_size} if _wants(fn, "world_size") else {}), **kwargs}
                   for r in range(world_size)]
    if method != "fork":           # fn, args, kwargs travel by value (notebook functions too)
        fn, args, rank_kwargs = _by_value(fn, args, rank_kwargs, method), (), [{}] * world_size

    workdir = make_workdir()
    cfg = _Config(world_size, chosen, float(timeout_s), workdir, dict(env or {}))
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        cfg.caller_env, cfg.caller_cwd = dict(os.environ), os.getcwd()
    procs = []
    timed_out = interrupted = False
    busy: set = set()
    try:
        sys.stdout.flush(), sys.stderr.flush()
        with _interrupts_held():
            for r in range(world_size):
                p = ctx.Process(target=_rank_main, args=(r, cfg, fn, args, rank_kwargs[r]),
                                name=f"course-rank-{r}", daemon=False)
                try:
                    p.start()
                except (OSError, EOFError) as exc:       # no server socket, or a dead server
                    if method != "forkserver":
                        raise
                    raise _ForkserverFailed(f"{type(exc).__name__}: {exc}") from None
                procs.append(p)
        deadline = time.monotonic() + timeout_s
        # until a rank fails (non-zero exit code), all have exited, or the deadline passed
        while not any(p.exitcode for p in procs) and _wait(procs, 0) and not timed_out:
            timed_out = (remaining := deadline - time.monotonic()) <= 0
            _wait(procs, min(0.2, remaining))
        if not timed_out and any(p.exitcode for p in procs):
            # A rank failed: give the others a moment to exit too (the lowest may still be
            # writing its error), then stop whoever is left (e.g. blocked in a collective).
            first, running = time.monotonic(), _wait(procs, 0)
            grace = first + _FAILURE_GRACE_S
            while running and time.monotonic() < grace:
                still = _wait(procs, grace - time.monotonic())
                if still < running:              # progress: the others get as long again
                    grace = min(first + _FAILURE_GRACE_MAX_S, time.monotonic() + _FAILURE_GRACE_S)
                running = still
        codes = [p.exitcode for p in procs]
        hung = [r for r, c in enumerate(codes) if c is None]
        if timed_out and hasattr(signal, "SIGUSR1"):
            busy = dump_hung_stacks(procs, hung, workdir, _read)
    except KeyboardInterrupt:  # the kernel's Stop button
        interrupted = True
    finally:
        _stop(procs)
        if method == "spawn":      # a forkserver keeps its tracker, as it keeps itself
            from .compat import stop_resource_tracker
            stop_resource_tracker()
        if interrupted or sys.exc_info()[0] is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    if interrupted:
        stopped = "its 1 rank was" if world_size == 1 else f"all {plural(world_size, 'rank')} were"
        raise KeyboardInterrupt(f"launch interrupted: {stopped} stopped") from None

    base = [os.path.join(workdir, f"rank{r}") for r in range(world_size)]
    never_ran = [r for r in range(world_size) if codes[r] and not os.path.exists(base[r] + ".started")]
    if method == "forkserver" and never_ran and not timed_out:
        # e.g. macOS aborting a child forked from a process with threads it distrusts
        shutil.rmtree(workdir, ignore_errors=True)
        code = codes[never_ran[0]]
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        raise _ForkserverFailed(f"rank {never_ran[0]} died ({how}) before it started")
    try:
        outputs = {r: _read(b + ".out") for r, b in enumerate(base)}
        dumps = {r: user_stacks(_read(b + ".stack")) for r, b in enumerate(base)}
        stacks_seen = {r: d[0] for r, d in dumps.items() if d}
        moving = {r for r, d in dumps.items() if len(d) > 1 and d[1] != d[0]} | busy
        for stream, texts in ((sys.stdout, outputs), (sys.stderr, {r: _read(b + ".err") for r, b in enumerate(base)})):
            for r in sorted(texts):
                for line in texts[r].splitlines():
                    print(f"[rank {r}] {line}", file=stream)
            stream.flush()
        failures = {r: _load(b + ".error") for r, b in enumerate(base) if os.path.exists(b + ".error")}
        missing = [r for r, b in enumerate(base) if not os.path.exists(b + ".result")]
        results = [None if r in missing else _load(b + ".result") for r, b in enumerate(base)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if timed_out:
        stacks = "\n".join(f"--- rank {r} ---\n{stacks_seen[r]}" for r in hung if stacks_seen.get(r))
        raise LaunchTimeout(f"rank(s) {hung} still running after timeout_s={timeout_s:g} s and were killed "
                            "(a hang: e.g. a rank waiting in a collective the others never call)."
                            + (f"\nWhere they were stuck:\n{stacks}" if stacks else ""), rank=hung[0], outputs=outputs,
                            stacks={r: stacks_seen.get(r, "") for r in hung}, moving=moving & set(hung),
                            cpu_measured=os.path.exists("/proc/self/stat"),
                            results={r: results[r] for r in range(world_size) if r not in missing})
    first = _first_failure(failures, codes, missing)
    if first in failures:
        info = failures[first]
        raise LaunchError(f"rank {first} raised {info['type']}: {info['message']}\n"
                          f"--- traceback of rank {first} ---\n{info['traceback']}",
                          rank=first, exc_type=info["type"], rank_traceback=info["traceback"], outputs=outputs)
    if first is not None:
        code = codes[first]
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        raise LaunchError(
            f"rank {first} {how} without reporting a result (it crashed, was killed, e.g. out of "
            "memory, or called sys.exit/os._exit)", rank=first, outputs=outputs,
            signal=-code if code is not None and code < 0 else None)
    out = RankResults(results)
    out.backend, out.start_method, out.world_size, out.outputs = chosen, method, world_size, outputs
    return out
