"""Launch overhead of course_utils.runtime.launch: 4 ranks, launch -> results, fork vs spawn.

    python benchmarks/launch_overhead.py [--ranks 4] [--repeat 10]

Measures the whole call: start the ranks, init the process group (gloo), run a tiny
all-reduce, barrier, tear down, collect results. The goal for fork is <= 0.5 s.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from course_utils.runtime.launch import launch


def tiny_all_reduce():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def measure(method: str, ranks: int, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = launch(tiny_all_reduce, ranks, quiet=True, start_method=method)
        times.append(time.perf_counter() - t0)
        assert out == [float(ranks)] * ranks
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    import os

    print(f"{args.ranks} gloo ranks on CPU, {os.cpu_count()} cores, torch {torch.__version__}")
    for method, repeat in (("fork", args.repeat), ("spawn", max(3, args.repeat // 3))):
        times = measure(method, args.ranks, repeat)
        print(f"{method:>5}: median {statistics.median(times):.3f} s, best {min(times):.3f} s, "
              f"worst {max(times):.3f} s over {repeat} launches")


if __name__ == "__main__":
    main()
