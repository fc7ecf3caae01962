"""Run a function on N real processes, one per rank: the course's launcher.

Taught in ``notebooks/00_orientation.ipynb``.  Every multi-process demo in the course
goes through :func:`launch` (or the ``%%ranks`` cell magic built on it), so a demo
cell behaves like the body of a ``torchrun`` script:

* each rank is a separate OS process with ``torch.distributed`` already
  initialised (``dist.get_rank()``, ``dist.get_world_size()`` work);
* ``backend="auto"`` picks NCCL with one GPU per rank when the machine has at least
  ``world_size`` GPUs, and gloo on CPU otherwise (laptops, CI, one-GPU Colab);
* on Linux, when CUDA is not initialised in the caller (and, with a GPU visible, no
  backward there has started autograd's GPU threads), ranks are *forked* from the
  caller (about 0.1 s for 4 ranks). Where forking the caller is unsafe (macOS; Linux
  with CUDA or autograd's GPU threads started) they are forked from a *forkserver*: a
  fresh process, started once, that has imported torch and ``course_utils`` and nothing
  else (the first launch pays about 4 s for it on 2 cores, later ones about as little
  as a fork: benchmarks/launch_overhead.py). Only where no forkserver exists (Windows) are they *spawned* as new
  interpreters (a few seconds each launch). Under a forkserver or spawn, ``fn`` and its
  arguments travel *by value* with ``cloudpickle``, so a function defined in a notebook
  cell runs either way (``COURSE_START_METHOD=fork|forkserver|spawn`` forces one);
* what each rank prints is captured and shown afterwards in rank order, prefixed with
  the rank, so the output of a cell is the same on every run;
* a rank that raises fails the launch within a fraction of a second with a
  :class:`LaunchError` naming that rank, even while the other ranks wait in a
  collective; a rank that hangs is killed at ``timeout_s``; no child process outlives
  the call (nor the caller: each rank dies with its parent on Linux);
* nothing is opened to the network: the ranks meet through a ``FileStore`` in the
  launch's private temporary folder (no port to pick, no listening socket), and gloo
  binds to the loopback interface, so no other machine can reach a demo's ranks.
  (A ``torchrun`` script keeps torchrun's own rendezvous, see the README.)
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

__all__ = [
    "launch",
    "LaunchError",
    "LaunchTimeout",
    "RankResults",
    "resolve_backend",
    "choose_start_method",
    "START_METHODS",
    "FORKSERVER_PRELOAD",
    "autograd_survives_fork",
    "rank_device",
    "describe_plan",
    "backend_label",
    "where",
    "loopback_interface",
    "gpu_count",
]

BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_TIMEOUT_S = 60.0
_KILL_GRACE_S = 1.0


class LaunchError(RuntimeError):
    """A rank failed (raised, crashed or hung). ``rank`` is the rank that failed first."""

    def __init__(self, message: str, *, rank: int | None, exc_type: str | None = None,
                 rank_traceback: str = "", outputs: dict[int, str] | None = None):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.rank_traceback = rank_traceback
        self.outputs = outputs or {}
        self.failed_ranks: list[int] = [] if rank is None else [rank]


class LaunchTimeout(LaunchError):
    """Some ranks were still running at ``timeout_s`` and were killed."""


class RankResults(list):
    """The list of return values, by rank, plus how the ranks were run."""

    backend: str
    start_method: str
    world_size: int
    outputs: dict[int, str]

    def describe(self) -> str:
        return describe_plan(self.world_size, self.backend, self.start_method)


# --------------------------------------------------------------------------- planning

def gpu_count() -> int:
    """CUDA GPUs visible to this process, counted without initialising CUDA here.

    The one GPU detection of the course: use it, never ``torch.cuda.is_available()``, in
    code that runs before ranks are launched. ``is_available()`` asks the CUDA runtime
    (``cudaGetDeviceCount``), which initialises the CUDA driver in this process (unless
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1``), and a rank forked afterwards cannot use the GPU.
    ``torch.cuda.device_count()`` asks NVML first, which leaves CUDA untouched (it falls
    back to the runtime only where NVML is missing); 0 on a torch built without CUDA.
    """
    import torch

    return torch.cuda.device_count()


def resolve_backend(world_size: int, backend: str = "auto") -> str:
    """The process-group backend ``launch`` will use for ``world_size`` ranks.

    ``"auto"``: ``"nccl"`` when there is one GPU per rank, else ``"gloo"`` (CPU).
    """
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


#: Environment variable that overrides the automatic start method.
START_METHOD_ENV = "COURSE_START_METHOD"
START_METHODS = ("fork", "forkserver", "spawn")
#: What the forkserver imports once, before it forks any rank, so that a rank starts with
#: what a forked one inherits: torch, its distributed packages and the course's code the
#: demos run (importing FSDP alone takes about 0.9 s here, per rank, on every launch).
#: Never anything that initialises CUDA (these imports do not; ``torch.cuda.is_available()``
#: would) nor DeepSpeed (it probes the accelerator when imported).
FORKSERVER_PRELOAD = [
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor",
    "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
    "torch.nn.parallel", "torch._dynamo", "numpy.random", "cloudpickle",  # the optimizers' step imports dynamo
    "course_utils.runtime.launch", "course_utils.harness.experiments", "course_utils.harness.model",
    "course_utils.labs.collectives_lab", "course_utils.impl.zero3", "course_utils.impl.hsdp",
]
#: The longest AF_UNIX socket path: 104 bytes on macOS and the BSDs, 108 on Linux. The
#: forkserver listens on ``$TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX`` (34 bytes more).
_SUN_PATH_MAX = 108 if sys.platform.startswith("linux") else 104
_forkserver_broken: str | None = None      # why the forkserver failed here, once it has


def _available(method: str) -> bool:
    return method in mp.get_all_start_methods()


def choose_start_method() -> str:
    """How ranks start: ``"fork"``, ``"forkserver"`` or ``"spawn"``.

    * ``"fork"`` on Linux while CUDA is not initialised in this process and a forked
      child can still run backward (:func:`autograd_survives_fork`, asked only when a GPU
      is visible): the fastest, and what CI runs.
    * else ``"forkserver"`` where the platform has one (macOS, Linux): ranks are forked
      from a fresh server process that preloaded torch (:data:`FORKSERVER_PRELOAD`), so
      neither this process's CUDA state nor its threads reach them, and Apple's frameworks
      never see a fork of a multi-threaded notebook kernel;
    * else ``"spawn"`` (Windows; or a forkserver that failed here: :func:`_why_not_fork`).

    ``COURSE_START_METHOD=fork|forkserver|spawn`` in the environment overrides it.
    """
    forced = os.environ.get(START_METHOD_ENV, "").strip()
    if forced:
        if forced not in START_METHODS:
            raise ValueError(f"{START_METHOD_ENV} must be one of {', '.join(START_METHODS)}, got {forced!r}")
        if not _available(forced):
            raise ValueError(f"{START_METHOD_ENV}={forced}: this platform ({sys.platform}) "
                             f"has no {forced} start method")
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
    return None


_AUTOGRAD_FORK_BROKEN = False       # once broken in this process, it stays broken
#: How long the probe child may take; one that deadlocks (autograd's threads after a fork)
#: is killed then, and counts as "broken".
FORK_PROBE_TIMEOUT_S = 10.0


def autograd_survives_fork() -> bool:
    """Whether a process forked from this one can run a backward pass.

    With a GPU visible, the first backward in a process starts autograd's device threads
    (also for a backward on the CPU), and a child forked after that refuses every backward
    ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"). Measured on an H200 with torch 2.11: a notebook cell that ran a
    one-process reference, then forked ranks. torch has no public flag for it, so this asks
    a forked child to run a tiny backward (a few milliseconds); a False is remembered.
    A child still running after :data:`FORK_PROBE_TIMEOUT_S` is killed: False.
    """
    global _AUTOGRAD_FORK_BROKEN
    if _AUTOGRAD_FORK_BROKEN:
        return False
    pid = os.fork()
    if pid == 0:                                     # the child: try, report, leave at once
        code = 1
        try:
            import torch

            x = torch.zeros(1, requires_grad=True)
            (2 * x).sum().backward()
            code = 0
        except BaseException:  # noqa: BLE001 - any failure means "do not fork"
            pass
        os._exit(code)
    deadline = time.monotonic() + FORK_PROBE_TIMEOUT_S
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done and time.monotonic() < deadline:
        time.sleep(0.005)
        done, status = os.waitpid(pid, os.WNOHANG)
    if not done:                                     # deadlocked: kill it, reap it
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    ok = bool(done) and os.waitstatus_to_exitcode(status) == 0
    _AUTOGRAD_FORK_BROKEN = not ok
    return ok


def backend_label(backend: str) -> str:
    """Where ranks of this backend compute, in words."""
    return "NCCL, one GPU per rank" if backend == "nccl" else "gloo on CPU"


def where(ranks, backend: str | None = None, *, backend_first: bool = False) -> str:
    """Where ``ranks`` ran, in words: the label the course's tables and reports print.

    ``ranks``: the :class:`RankResults` a :func:`launch` returned (its length is the world
    size, its ``.backend`` the backend unless ``backend`` is given), or a world size,
    with ``backend`` (``"gloo"`` or ``"nccl"``, as :func:`resolve_backend` returns it).

    ``"2 ranks, gloo on CPU"``, ``"1 rank, NCCL, one GPU per rank"`` (the words of
    :func:`backend_label`); ``backend_first=True``: ``"2 gloo ranks on CPU"``,
    ``"2 NCCL ranks, one GPU each"``.
    """
    n = ranks if isinstance(ranks, int) else len(ranks)
    if backend is None:
        if isinstance(ranks, int):
            raise TypeError("where(world_size, backend): a world size needs its backend")
        backend = ranks.backend
    if backend_first:
        return (plural(n, "NCCL rank") + ", one GPU each" if backend == "nccl"
                else plural(n, "gloo rank") + " on CPU")
    return f"{plural(n, 'rank')}, {backend_label(backend)}"


def _why_not_fork() -> str:
    """Why ranks are not forked from this process, in a few words."""
    forced = os.environ.get(START_METHOD_ENV, "").strip()
    if forced in ("forkserver", "spawn"):
        return f"{START_METHOD_ENV}={forced}"
    if not sys.platform.startswith("linux"):
        return (f"{sys.platform} cannot fork a kernel safely" if _available("fork")
                else f"{sys.platform} cannot fork")
    import torch

    if torch.cuda.is_initialized():
        return "CUDA is initialised in this process"
    if _AUTOGRAD_FORK_BROKEN:
        return "a backward ran here next to a GPU: forked ranks could not run one"
    return "asked for"


def _why_spawn() -> str:
    """Why ranks are spawned: why not forked, and why not from a forkserver."""
    why = _why_not_fork()
    problem = None if why.startswith(START_METHOD_ENV) else (
        "no forkserver on this platform" if not _available("forkserver") else _forkserver_problem())
    return f"{why}; {problem}" if problem else why


_HOW = {"fork": "forked from this process",
        "forkserver": "forked from a preloaded forkserver",
        "spawn": "spawned as new interpreters"}


def describe_plan(world_size: int, backend: str, method: str, why: str | None = None) -> str:
    """The one line ``launch`` prints: how many ranks, which backend, how they start and,
    unless they are forked from this process, why (``why``, or worked out here)."""
    if method not in _HOW:
        raise ValueError(f"method must be one of {START_METHODS}, got {method!r}")
    if why is None and method != "fork":
        why = _why_not_fork() if method == "forkserver" else _why_spawn()
    return f"launch: {where(world_size, backend)}, {_HOW[method]}" + (f" ({why})" if why else "")


def rank_device():
    """The ``torch.device`` this rank should compute on (inside a launched rank)."""
    import torch

    if os.environ.get("COURSE_BACKEND") == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def loopback_interface() -> str | None:
    """The loopback interface's name (``"lo"`` on Linux, ``"lo0"`` on macOS), or None
    where this platform names none (Windows): gloo binds there when it is set."""
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
    #: forkserver: the caller's environment and folder now (the server holds the ones it
    #: started with), so a rank sees what a forked one would
    caller_env: dict | None = None
    caller_cwd: str | None = None


def _watch_parent() -> None:
    """macOS (no PR_SET_PDEATHSIG): a daemon thread ends this rank once its parent (the
    kernel, or the forkserver, which ends with the kernel) is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="course-watch-parent", daemon=True).start()


def _die_with_parent() -> None:
    """Ask the OS to end this rank if the process that started it dies."""
    if not sys.platform.startswith("linux"):
        if os.name == "posix":
            _watch_parent()
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # pragma: no cover - best effort only
        pass


def _redirect_output(path_out: str, path_err: str):
    """Point fds 1/2 and sys.stdout/sys.stderr at per-rank files."""
    for fd, path in ((1, path_out), (2, path_err)):
        with open(path, "wb", buffering=0) as f:
            os.dup2(f.fileno(), fd)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0, closefd=False),
                                  encoding="utf-8", line_buffering=True, write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0, closefd=False),
                                  encoding="utf-8", line_buffering=True, write_through=True)


def _to_portable(value):
    """Tensors to detached CPU tensors (recursively), so any process can unpickle them."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return type(value)((k, _to_portable(v)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_to_portable(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_portable(v) for v in value)
    return value


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class _ByValue:
    """What a spawned rank runs: ``fn``, ``args`` and every rank's kwargs serialised with
    ``cloudpickle``, which pickles a function defined in a notebook (``__main__``) by value:
    its code, defaults and the globals it uses. A spawned interpreter has none of the
    notebook's definitions, so plain pickle (by reference) would fail there."""

    def __init__(self, payload: bytes):
        self.payload = payload

    @classmethod
    def pack(cls, fn: Callable, args: tuple, rank_kwargs: list, method: str = "spawn") -> "_ByValue":
        why = _why_not_fork() if method == "forkserver" else _why_spawn()
        try:
            import cloudpickle
        except ImportError:
            raise LaunchError(f"ranks are {_HOW[method]} here ({why}) and need cloudpickle to "
                              "receive fn: pip install cloudpickle", rank=None) from None

        try:
            return cls(cloudpickle.dumps((fn, args, rank_kwargs)))
        except Exception as exc:
            raise LaunchError(
                f"ranks are {_HOW[method]} here ({why}), so fn and its arguments are sent to "
                f"them by value, but {getattr(fn, '__qualname__', fn)!r} or an argument cannot "
                f"be serialised ({type(exc).__name__}: {exc}). Pass plain values and tensors, "
                "and leave out what belongs to this process (open files, locks, sockets).",
                rank=None,
            ) from None

    def unpack(self, rank: int):
        fn, args, rank_kwargs = pickle.loads(self.payload)
        return fn, args, rank_kwargs[rank]


def _rank_main(rank: int, cfg: _Config, fn: Callable, args: tuple, kwargs: dict) -> None:
    if signal.getsignal(signal.SIGINT) is _hold_interrupt:  # forked inside _interrupts_held
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if cfg.caller_env is not None:                  # forked by the forkserver
        from .compat import release_forkserver_pipe

        release_forkserver_pipe()
    _die_with_parent()
    base = os.path.join(cfg.workdir, f"rank{rank}")
    with open(base + ".started", "wb"):             # the launcher tells a rank that never
        pass                                         # ran from one that failed
    if cfg.caller_env is not None:
        os.environ.clear()
        os.environ.update(cfg.caller_env)
    if cfg.caller_cwd is not None:
        with contextlib.suppress(OSError):
            os.chdir(cfg.caller_cwd)
    _redirect_output(base + ".out", base + ".err")
    if hasattr(signal, "SIGUSR1"):  # the launcher asks a hung rank for its stack
        stack_file = open(base + ".stack", "wb", buffering=0)
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    code = 0
    try:
        os.environ.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(cfg.world_size),
            "LOCAL_WORLD_SIZE": str(cfg.world_size), "GROUP_RANK": "0",
            "OMP_NUM_THREADS": "1", "COURSE_BACKEND": cfg.backend,
        })
        # gloo otherwise binds to the address the host name resolves to (often the LAN)
        lo = loopback_interface()
        if lo is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = lo
        os.environ.update(cfg.env)
        import torch
        import torch.distributed as dist

        # One intra-op thread per rank: N ranks share the cores (4 ranks on 2 cores ran
        # ~30x faster this way), and CPU results do not depend on the core count.
        torch.set_num_threads(1)
        # torch read TORCH_DISTRIBUTED_DEBUG when the parent imported it, before env= applied
        if hasattr(dist, "set_debug_level_from_env"):
            dist.set_debug_level_from_env()
        device_id = None
        if cfg.backend == "nccl":  # rank r computes on GPU r (what rank_device() returns)
            device_id = torch.device("cuda", rank)
            torch.cuda.set_device(device_id)
        # Sockets inherited from the caller (a notebook kernel's) are not this rank's traffic
        from .wire import ignore_inherited_sockets

        ignore_inherited_sockets()
        # The rendezvous: a file in the launch's private folder, not a TCP store that
        # would listen on every interface on a port picked by bind-and-release.
        store = dist.FileStore(os.path.join(cfg.workdir, "store"), cfg.world_size)
        # device_id binds the group to this rank's GPU: NCCL builds its communicator now
        # (an NCCL problem fails here, not in fn's first collective) and the closing
        # barrier runs on that GPU, not on a guessed one.
        dist.init_process_group(cfg.backend, store=store, rank=rank,
                                world_size=cfg.world_size,
                                timeout=timedelta(seconds=cfg.timeout_s), device_id=device_id)
        # Wait (on the file, no collective, no network) until every rank's group is built:
        # otherwise a rank whose fn fails at once can exit while a peer is still connecting
        # its gloo mesh, and that peer fails in init instead of in fn (seen in CI: "every
        # rank raises" then reported rank 1, rank 0 having died in connectFullMesh).
        store.set(f"course-ready-{rank}", "1")
        store.wait([f"course-ready-{r}" for r in range(cfg.world_size)])
        if isinstance(fn, _ByValue):
            fn, args, kwargs = fn.unpack(rank)
        result = fn(*args, **kwargs)
        try:
            payload = pickle.dumps(_to_portable(result))
        except Exception as exc:
            raise TypeError(
                f"rank {rank} returned a {type(result).__name__} that cannot be pickled "
                f"({exc}); return plain Python values or tensors"
            ) from exc
        _write_atomic(base + ".result", payload)
        if dist.is_initialized():  # fn may have torn the group down itself
            dist.barrier()
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        code = 1
        info = {
            "time": time.time(), "type": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exc(),
        }
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
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


#: The line gloo itself writes to each rank's stdout when its connections are up, in
#: torch 2.9 and 2.10 (later torch does not print it): a log line, not the rank's output.
_GLOO_CONNECTED = re.compile(
    r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
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


def _secondary(info: dict) -> bool:
    """An error a rank got because a peer died (connection closed), not a cause."""
    return info["type"] in _COMM_ERRORS or any(w in info["message"] for w in _COMM_WORDS)


#: Seconds the launcher waits, after a rank fails, for the others to exit by themselves;
#: each rank that does exit in that time buys the rest as long again (a loaded machine
#: schedules ranks late), up to _FAILURE_GRACE_MAX_S in all.
_FAILURE_GRACE_S = 0.5
_FAILURE_GRACE_MAX_S = 5.0


def _root_cause(failures: dict[int, dict]) -> int:
    """Among Python errors, the earliest; among those raised within 1 s of it, the
    lowest rank (deterministic when every rank raises the same exception)."""
    t0 = min(f["time"] for f in failures.values())
    return min(r for r, f in failures.items() if f["time"] - t0 < 1.0)


def _user_stack(dump: str) -> str:
    """A faulthandler dump, innermost first, cut where the launcher's own frames begin."""
    kept = []
    for line in dump.splitlines():
        if " in _rank_main" in line:
            break
        kept.append(line)
    return "\n".join(kept).strip()


_held_interrupts: list = []


def _hold_interrupt(signum, frame) -> None:
    _held_interrupts.append(signum)


@contextlib.contextmanager
def _interrupts_held():
    """Hold back Ctrl-C (the kernel's Stop button) while the ranks are being started: an
    interrupt raised inside ``Process.start()`` after its fork would leave a rank the
    launcher does not know about (and that ``multiprocessing`` joins at exit). The
    interrupt is raised once every rank is started, and the launch then stops them all.
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
    for p in procs:
        p.join()
        with contextlib.suppress(Exception):
            p.close()


def _print_outputs(outputs: dict[int, str], errors: dict[int, str]) -> None:
    for rank in sorted(outputs):
        for line in outputs[rank].splitlines():
            print(f"[rank {rank}] {line}", file=sys.stdout)
    sys.stdout.flush()
    for rank in sorted(errors):
        for line in errors[rank].splitlines():
            print(f"[rank {rank}] {line}", file=sys.stderr)
    sys.stderr.flush()


def launch(fn: Callable, world_size: int, *args, backend: str = "auto",
           timeout_s: float = DEFAULT_TIMEOUT_S, env: dict | None = None,
           quiet: bool = False, start_method: str = "auto", **kwargs) -> RankResults:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return its values by rank.

    Inside ``fn`` the default process group is initialised, so ``dist.get_rank()``
    and every collective work. If ``fn`` has a parameter called ``rank`` or
    ``world_size`` (and you did not pass it), it is filled in for you.

    Args:
        fn: the function each rank runs: any function, one defined in a notebook cell
            included (spawned ranks get it by value).
        world_size: number of ranks (processes), >= 1.
        backend: ``"auto"``, ``"gloo"`` or ``"nccl"``; see :func:`resolve_backend`.
        timeout_s: ranks still running after this many seconds are killed and
            :class:`LaunchTimeout` is raised; also the process-group timeout.
        env: extra environment variables for the ranks
            (e.g. ``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}``).
        quiet: do not print the one-line plan before the ranks' output.
        start_method: ``"auto"`` (see :func:`choose_start_method`), ``"fork"``,
            ``"forkserver"`` or ``"spawn"`` (the last two send ``fn`` and its arguments by
            value, with ``cloudpickle``).

    Returns:
        A :class:`RankResults` list (``results[r]`` is rank r's return value, tensors
        moved to CPU) with ``.backend``, ``.start_method`` and ``.outputs``.

    Raises:
        LaunchError: a rank raised or crashed (``.rank`` names it, the message carries
            its traceback). LaunchTimeout: ranks were still running at ``timeout_s``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (a function each rank runs), got {type(fn).__name__}")
    check_int("world_size", world_size, 1)
    check_timeout(timeout_s)
    if env is not None and not (isinstance(env, dict)
                                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError("env must be a dict of str -> str environment variables")
    chosen = resolve_backend(world_size, backend)
    if start_method not in ("auto",) + START_METHODS:
        raise ValueError(f"start_method must be 'auto', 'fork', 'forkserver' or 'spawn', got {start_method!r}")
    if start_method != "auto" and not _available(start_method):
        raise ValueError(f"this platform ({sys.platform}) has no {start_method} start method; "
                         "use start_method='spawn'")
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


def _launch_with(method: str, fn: Callable, world_size: int, chosen: str, args: tuple,
                 kwargs: dict, timeout_s: float, env: dict | None, quiet: bool,
                 why: str | None = None) -> RankResults:
    """:func:`launch` with the start method decided."""
    if not quiet:
        print(describe_plan(world_size, chosen, method, why), flush=True)

    rank_kwargs = []
    for r in range(world_size):
        kw = dict(kwargs)
        if "rank" not in kw and _wants(fn, "rank"):
            kw["rank"] = r
        if "world_size" not in kw and _wants(fn, "world_size"):
            kw["world_size"] = world_size
        rank_kwargs.append(kw)
    if method != "fork":           # fn, args, kwargs travel by value (notebook functions too)
        fn, args, rank_kwargs = _ByValue.pack(fn, args, rank_kwargs, method), (), [{}] * world_size

    workdir = tempfile.mkdtemp(prefix="course-launch-")
    cfg = _Config(world_size, chosen, float(timeout_s), workdir, dict(env or {}))
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        cfg.caller_env, cfg.caller_cwd = dict(os.environ), os.getcwd()
    procs = []
    codes: list = [None] * world_size
    timed_out = interrupted = False
    try:
        sys.stdout.flush()
        sys.stderr.flush()
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
        while True:
            codes = [p.exitcode for p in procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            mp.connection.wait([p.sentinel for p in procs if p.exitcode is None],
                               timeout=min(0.2, remaining))
        if not timed_out and any(c not in (None, 0) for c in codes):
            # A rank failed: give the others a moment to exit too (when every rank raises,
            # the lowest one may still be writing its error), then stop whoever is left,
            # e.g. ranks blocked in a collective with the dead one.
            first = time.monotonic()
            grace = first + _FAILURE_GRACE_S
            running = sum(p.exitcode is None for p in procs)
            while running and time.monotonic() < grace:
                mp.connection.wait([p.sentinel for p in procs if p.exitcode is None],
                                   timeout=max(0.0, grace - time.monotonic()))
                still = sum(p.exitcode is None for p in procs)
                if still < running:              # progress: the others get as long again
                    grace = min(first + _FAILURE_GRACE_MAX_S, time.monotonic() + _FAILURE_GRACE_S)
                running = still
            codes = [p.exitcode for p in procs]
        hung = [r for r, p in enumerate(procs) if p.exitcode is None]
        if timed_out and hasattr(signal, "SIGUSR1"):
            for r in hung:  # dump each hung rank's Python stack into its stderr file
                with contextlib.suppress(Exception):
                    os.kill(procs[r].pid, signal.SIGUSR1)
            time.sleep(0.3)
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
    never_ran = [r for r in range(world_size)
                 if codes[r] not in (None, 0) and not os.path.exists(base[r] + ".started")]
    if method == "forkserver" and never_ran and not timed_out:
        # e.g. macOS aborting a child forked from a process with threads it distrusts
        shutil.rmtree(workdir, ignore_errors=True)
        code = codes[never_ran[0]]
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        raise _ForkserverFailed(f"rank {never_ran[0]} died ({how}) before it started")
    try:
        outputs = {r: _read(base[r] + ".out") for r in range(world_size)}
        errors = {r: _read(base[r] + ".err") for r in range(world_size)}
        stacks_seen = {r: _user_stack(_read(base[r] + ".stack")) for r in range(world_size)}
        _print_outputs(outputs, {r: e for r, e in errors.items() if e})
        failures = {}
        for r in range(world_size):
            with contextlib.suppress(FileNotFoundError):
                with open(base[r] + ".error", "rb") as f:
                    failures[r] = pickle.loads(f.read())
        results = []
        missing = []
        for r in range(world_size):
            try:
                with open(base[r] + ".result", "rb") as f:
                    results.append(pickle.loads(f.read()))
            except FileNotFoundError:
                missing.append(r)
                results.append(None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if timed_out:
        stacks = "\n".join(f"--- rank {r} ---\n{stacks_seen[r]}" for r in hung if stacks_seen.get(r))
        raise LaunchTimeout(
            f"rank(s) {hung} still running after timeout_s={timeout_s:g} s and were killed "
            f"(a hang: e.g. a rank waiting in a collective the others never call)."
            + (f"\nWhere they were stuck:\n{stacks}" if stacks else ""),
            rank=hung[0], outputs=outputs,
        )
    # Ranks that died without a Python error (a signal, os._exit) before we stopped them.
    crashed = [r for r in range(world_size) if codes[r] not in (None, 0) and r not in failures]
    primary = {r: f for r, f in failures.items() if not _secondary(f)}
    if primary or (failures and not crashed):
        first = _root_cause(primary or failures)
        info = failures[first]
        err = LaunchError(
            f"rank {first} raised {info['type']}: {info['message']}\n"
            f"--- traceback of rank {first} ---\n{info['traceback']}",
            rank=first, exc_type=info["type"], rank_traceback=info["traceback"], outputs=outputs,
        )
        err.failed_ranks = sorted(set(failures) | set(crashed))
        raise err
    if crashed or missing:
        r = min(crashed or missing)
        code = codes[r]
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        err = LaunchError(
            f"rank {r} {how} without reporting a result (it crashed, was killed, e.g. out of "
            "memory, or called sys.exit/os._exit)",
            rank=r, outputs=outputs,
        )
        err.failed_ranks = sorted(set(failures) | set(crashed)) or [r]
        raise err
    out = RankResults(results)
    out.backend, out.start_method, out.world_size, out.outputs = chosen, method, world_size, outputs
    return out
