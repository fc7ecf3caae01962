"""Module-level rank functions the tests launch (importable, so spawn can run them)."""
import os
import time

import torch
import torch.distributed as dist


def rank_and_sum():
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def write_pid_then_sleep(pid_dir):
    with open(os.path.join(pid_dir, f"{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def sockets_after_a_collective():
    """This rank's TCP sockets, (status, ip) pairs, after an all-reduce."""
    import psutil

    dist.all_reduce(torch.ones(4096))
    me = psutil.Process()
    conns = me.net_connections(kind="inet") if hasattr(me, "net_connections") else me.connections(kind="inet")
    return [(c.status, c.laddr.ip) for c in conns]
