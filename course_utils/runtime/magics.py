"""The ``%%ranks N`` cell magic: run a notebook cell on N ranks.

Taught in ``notebooks/00_orientation.ipynb``. Registered when ``course_utils`` is
imported inside IPython (or with ``%load_ext course_utils``). In the cell, ``rank``,
``world_size``, ``dist``, ``torch`` and ``device`` are defined, so it reads like the
body of a torchrun script. Whatever each rank assigns to ``result`` comes back to the
notebook as the list ``result`` (by rank)::

    %%ranks 4
    t = torch.tensor([rank + 1.0], device=device)   # this rank's GPU under NCCL, else the CPU
    dist.all_reduce(t)
    result = t.item()

Options: ``--backend {auto,gloo,nccl}``, ``--timeout SECONDS``, ``--network 6MB/s,50us``
(the cell runs under that modelled network, :mod:`course_utils.runtime.network`: its
collectives complete when such a link would deliver them; ``net`` is the network, its
``transfers`` what went on this rank's link).
Every rank sees the variables defined so far in the notebook (changes it makes stay in
the rank). Forked ranks (Linux) inherit them all; spawned ranks (macOS, Windows, CUDA
already initialised in the kernel) get a copy of each one that can be pickled
(cloudpickle): an open file, a lock or a socket is left out.
"""
from __future__ import annotations

import argparse
import shlex

from .launch import DEFAULT_TIMEOUT_S, choose_start_method, launch

__all__ = ["run_cell", "ranks", "register"]


def run_cell(source: str, namespace: dict | None = None, network=None):
    """Rank side of ``%%ranks``: execute ``source`` (under ``network``, a modelled network's
    spec) and return its ``result``."""
    import contextlib

    import torch
    import torch.distributed as dist
    from .launch import rank_device
    from .network import ModelledNetwork

    ns = dict(namespace or {})
    ns.pop("result", None)
    ns.update(rank=dist.get_rank(), world_size=dist.get_world_size(), dist=dist,
              torch=torch, device=rank_device())
    with (ModelledNetwork(network) if network is not None else contextlib.nullcontext()) as net:
        ns["net"] = net
        exec(compile(source, "<%%ranks cell>", "exec"), ns)  # noqa: S102 - the learner's cell
    return ns.get("result")


def _travels(value) -> bool:
    import cloudpickle
    try:
        cloudpickle.dumps(value)
    except Exception:
        return False
    return True


def ranks(line: str, cell: str, user_ns: dict | None = None):
    """Run ``cell`` on ranks as ``%%ranks`` does; return the list of ``result`` by rank."""
    parser = argparse.ArgumentParser(prog="%%ranks", add_help=False)
    parser.add_argument("world_size", type=int)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--network", default=None)
    try:
        opts = parser.parse_args(shlex.split(line))
    except SystemExit:
        raise ValueError(
            f"usage: %%ranks N [--backend auto|gloo|nccl] [--timeout SECONDS] [--network 6MB/s,50us], "
            f"got '%%ranks {line}'"
        ) from None
    from .network import parse_network
    network = parse_network(opts.network) if opts.network is not None else None
    ns = {k: v for k, v in (user_ns or {}).items()
          if not k.startswith("_") and k not in ("In", "Out", "exit", "quit", "get_ipython")}
    if choose_start_method() != "fork":                 # the namespace travels by value
        ns = {k: v for k, v in ns.items() if _travels(v)}
    return list(launch(run_cell, opts.world_size, cell, ns, network,
                       backend=opts.backend, timeout_s=opts.timeout))


def register(ipython) -> None:
    def _ranks(line, cell):
        ipython.user_ns["result"] = ranks(line, cell, ipython.user_ns)

    _ranks.__doc__ = __doc__
    ipython.register_magic_function(_ranks, magic_kind="cell", magic_name="ranks")
