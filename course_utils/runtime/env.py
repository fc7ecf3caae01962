"""Where am I running, and where will the demos run (notebook 00)? Nothing here initialises
CUDA (names come from ``nvidia-smi``), so the launcher can still fork."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import subprocess
import sys

from .fmt import table as fmt_table
from .launch import backend_label, choose_start_method, gpu_count, resolve_backend

__all__ = ["Environment", "detect", "in_colab", "gpu_names", "plan", "table"]


def in_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def gpu_names() -> list[str]:
    """Names of the visible NVIDIA GPUs, from nvidia-smi."""
    count = gpu_count()
    if not count:
        return []
    names: list[str] = []
    if smi := shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            names = [line.strip() for line in out.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if names and visible not in (None, ""):
        idx = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        names = [names[i] for i in idx if i < len(names)] or names
    return (names + ["unknown GPU"] * count)[:count]


@dataclasses.dataclass(frozen=True)
class Environment:
    where: str
    python: str
    torch: str
    os: str
    cpu_count: int
    gpu_count: int
    gpus: tuple[str, ...]
    start_method: str

    def rows(self) -> list[tuple[str, str]]:
        gpus = f"{self.gpu_count} ({', '.join(self.gpus) or 'none'})" if self.gpu_count else "0"
        return [("running in", self.where), ("python", self.python), ("torch", self.torch), ("os", self.os),
                ("CPU cores", str(self.cpu_count)), ("GPUs", gpus), ("ranks start by", self.start_method)]


def detect() -> Environment:
    import torch
    names = gpu_names()
    return Environment(where="Google Colab" if in_colab() else "a local Python (not Colab)",
                       python=platform.python_version(), torch=torch.__version__,
                       os=f"{platform.system()} {platform.machine()}", cpu_count=os.cpu_count() or 1,
                       gpu_count=len(names), gpus=tuple(names), start_method=choose_start_method())


def plan(world_sizes=(1, 2, 4, 8)) -> list[tuple[int, str]]:
    """For each world size, the backend ``launch(..., backend="auto")`` will use."""
    if isinstance(world_sizes, int) and not isinstance(world_sizes, bool):
        world_sizes = (world_sizes,)
    try:
        sizes = list(world_sizes)
    except TypeError:
        raise TypeError("world_sizes must be an int or a sequence of ints, e.g. (1, 2, 4)") from None
    return [(n, resolve_backend(n, "auto")) for n in sizes]


def table(world_sizes=(1, 2, 4, 8), env: Environment | None = None) -> str:
    """One short table: this machine, then the backend each demo size will use."""
    env = env or detect()
    rows = env.rows() + [(f"demo, {n} rank{'s' if n > 1 else ''}", backend_label(b))
                         for n, b in plan(world_sizes)]
    return fmt_table(rows[0], rows[1:], left=(0, 1), rules=())
