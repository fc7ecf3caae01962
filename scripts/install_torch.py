"""Install torch into this Python for the course, sized for the machine: what `make` runs first.

* A torch that already imports is kept, whatever it is (Colab's, a cluster's CUDA build).
* Linux **without an NVIDIA GPU**: the CPU build from PyTorch's CPU wheel index
  (about 200 MB), when that index answers; PyPI's Linux build of the same version is the
  CUDA one, which pulls several GB of ``nvidia-*`` libraries the machine cannot use.
* With an NVIDIA GPU, on macOS (PyPI's macOS wheels are CPU/MPS builds) and on Windows
  (PyPI's Windows wheels are CPU builds): the default index (PyPI, or whatever pip is
  configured to use).
* The index cannot be reached (offline, a proxy, a mirror-only network): the default
  index, with a line saying so.

Stdlib only (it runs before anything else is installed). Variables, as for `make`:

``TORCH_SPEC``   what to install (default ``torch==2.13.0``);
``TORCH_INDEX``  ``auto`` (default: as above), ``default`` (pip's own index), ``cpu`` (the CPU
                 index, no probe), or any index URL (used as pip's ``--index-url``).

``python scripts/install_torch.py --dry-run`` prints the decision and installs nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

DEFAULT_SPEC = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclasses.dataclass(frozen=True)
class Choice:
    """What to run: ``index`` None means pip's default index."""

    spec: str
    index: str | None
    reason: str

    def pip_args(self) -> list[str]:
        return ["install", self.spec] + (["--index-url", self.index] if self.index else [])


def has_nvidia_gpu(system: str | None = None) -> bool:
    """An NVIDIA driver is present (its device files or ``nvidia-smi``); CUDA is never touched."""
    system = system or platform.system()
    if system == "Linux" and (Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()):
        return True
    return shutil.which("nvidia-smi") is not None


def index_reachable(url: str = CPU_INDEX, timeout_s: float = 5.0) -> bool:
    """The index answers a request for torch's page within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout_s) as r:
            return 200 <= r.status < 400
    except (OSError, ValueError):
        return False


def choose(*, system: str, has_gpu: bool, reachable, spec: str = DEFAULT_SPEC,
           index: str = "auto") -> Choice:
    """The decision, from facts passed in (tests call this without a network or a GPU).

    ``reachable`` is a callable ``url -> bool``, asked only when the CPU index would be used.
    """
    if not isinstance(spec, str) or not spec.strip().startswith("torch"):
        raise ValueError(f"TORCH_SPEC must name torch, e.g. 'torch==2.13.0', got {spec!r}")
    if index == "default":
        return Choice(spec, None, "TORCH_INDEX=default: pip's default index")
    if index == "cpu":
        return Choice(spec, CPU_INDEX, "TORCH_INDEX=cpu: PyTorch's CPU wheel index")
    if index != "auto":
        if not index.startswith(("http://", "https://", "file:")):
            raise ValueError(f"TORCH_INDEX must be auto, default, cpu or an index URL, got {index!r}")
        return Choice(spec, index, f"TORCH_INDEX={index}")
    if system == "Darwin":
        return Choice(spec, None, "macOS: PyPI's wheel is the CPU/MPS build")
    if system == "Windows":
        return Choice(spec, None, "Windows: PyPI's wheel is the CPU build")
    if has_gpu:
        return Choice(spec, None, "an NVIDIA GPU is present: the default (CUDA) build")
    if reachable(CPU_INDEX):
        return Choice(spec, CPU_INDEX, "no NVIDIA GPU: the CPU build (about 200 MB instead of several GB)")
    return Choice(spec, None, f"no NVIDIA GPU, but {CPU_INDEX} cannot be reached: pip's default index")


def torch_installed(python: str) -> str | None:
    """The version of the torch ``python`` imports, or None."""
    got = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return got.stdout.strip() if got.returncode == 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="the Python to install into")
    ap.add_argument("--dry-run", action="store_true", help="print the decision, install nothing")
    args = ap.parse_args(argv)
    have = torch_installed(args.python)
    if have:
        print(f"torch {have} is already installed: kept")
        return 0
    choice = choose(system=platform.system(), has_gpu=has_nvidia_gpu(), reachable=index_reachable,
                    spec=os.environ.get("TORCH_SPEC") or DEFAULT_SPEC,
                    index=os.environ.get("TORCH_INDEX") or "auto")
    cmd = [args.python, "-m", "pip"] + choice.pip_args()
    print(f"installing {choice.spec} ({choice.reason}): {' '.join(cmd)}", flush=True)
    if args.dry_run:
        return 0
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
