"""Launch overhead of course_utils.runtime.launch: 4 ranks, launch -> results, for each
start method: fork (Linux), forkserver (macOS; Linux after CUDA or a backward next to a
GPU), spawn (Windows).

    python benchmarks/launch_overhead.py [--ranks 4] [--repeat 10]

Measures the whole call: start the ranks, init the process group (gloo), run a tiny
all-reduce, barrier, tear down, collect results. A forkserver's first launch also starts
the server (a fresh interpreter that imports torch), so the first launch is reported
apart from the median of the others. Goals: fork <= 0.5 s; a forkserver launch after the
first within 2x of a fork launch.
"""
import argparse
import os
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
    print(f"{args.ranks} gloo ranks on CPU, {os.cpu_count()} cores, torch {torch.__version__}")
    medians = {}
    for method, repeat in (("fork", args.repeat), ("forkserver", args.repeat),
                           ("spawn", max(1, args.repeat // 3))):
        first, *rest = measure(method, args.ranks, repeat + 1)
        medians[method] = statistics.median(rest)
        print(f"{method:>10}: first {first:.3f} s; then median {medians[method]:.3f} s, best "
              f"{min(rest):.3f} s, worst {max(rest):.3f} s over {repeat} launches")
    ratio = medians["forkserver"] / medians["fork"]
    print(f"forkserver / fork, median after the first: {ratio:.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main()
