"""Step time of the course's DDP from scratch ("ddp") vs torch DDP ("torch-ddp").

    python benchmarks/ddp_step_time.py [--ranks 2] [--steps 20] [--repeat 3] [--models course,wide]

Both strategies train the same model on the same data through
``course_utils.harness.experiments.run`` (gloo on CPU here, one thread per rank). A step is
forward + backward + optimizer.step() + zero_grad(); for each run we take the slowest
rank's median step time, and report the median over ``--repeat`` runs, alternating the
two strategies so that drift in machine load hits both alike. Goal: scratch within
1.2x of torch DDP.

Models: ``course`` is COURSE_CONFIG (129k parameters, 0.5 MB of gradients: latency
bound); ``wide`` (hidden 256, 4 layers, vocab 2048: 3.7M parameters, 15 MB of
gradients) makes communication matter.
"""
import argparse
import statistics

from course_utils.theory.config import COURSE_CONFIG, TransformerConfig
from course_utils.harness.experiments import run
from course_utils.impl.common import DEFAULT_BUCKET_BYTES

MODELS = {
    "course": COURSE_CONFIG,
    "wide": TransformerConfig(hidden=256, layers=4, heads=4, vocab=2048, seq=64),
}


def step_time(strategy: str, config, ranks: int, steps: int, **options) -> float:
    """The slowest rank's median step time of ``run(strategy, ...)`` (options: bucket_bytes,
    overlap, ...)."""
    out = run(strategy, ranks, steps=steps, config=config, quiet=True, timeout_s=600, **options)
    return max(r.step_time_s for r in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="course,wide")
    ap.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_BYTES / 2**20)
    args = ap.parse_args()
    bucket_bytes = int(args.bucket_mb * 2**20)
    print(f"{args.ranks} ranks (gloo, CPU), {args.steps} steps per run, {args.repeat} runs each, "
          f"buckets {args.bucket_mb:g} MiB")
    for name in args.models.split(","):
        config = MODELS[name]
        times = {"ddp": [], "torch-ddp": []}
        for _ in range(args.repeat):
            for strategy in times:
                times[strategy].append(step_time(strategy, config, args.ranks, args.steps, bucket_bytes=bucket_bytes))
        med = {s: statistics.median(t) for s, t in times.items()}
        ratio = med["ddp"] / med["torch-ddp"]
        print(f"{name:7s} {config.num_params():>10,} params  ddp {med['ddp'] * 1e3:8.2f} ms  "
              f"torch-ddp {med['torch-ddp'] * 1e3:8.2f} ms  ratio {ratio:.2f}x "
              f"({'within' if ratio <= 1.2 else 'OVER'} 1.2x)")


if __name__ == "__main__":
    main()
