"""Step time of ZeRO-3 from scratch ("zero3", prefetch on and off) vs torch FSDP2
("torch-fsdp") and the course's DDP ("ddp"). Goal: scratch ZeRO-3 within 1.3x of FSDP2.

    python benchmarks/zero3_step_time.py [--ranks 2] [--steps 20] [--repeat 3] [--models course,wide]

Every strategy trains the same model on the same data through
``course_utils.harness.experiments.run`` (gloo on CPU here). ``"zero3"`` with ``overlap=True``
prefetches the next unit's all-gather while the current unit computes; ``overlap=False``
gathers each unit only when it is needed. A step is forward + backward +
optimizer.step() + zero_grad(); for each run we take the slowest rank's median step
time and report the median over ``--repeat`` runs, alternating the strategies so that
drift in machine load hits all alike. ``"torch-fsdp"`` is added when it is registered.

Models: ``course`` is COURSE_CONFIG (129k parameters: latency bound); ``wide`` (hidden
256, 4 layers, vocab 2048: 3.7M parameters) makes the bytes matter.
"""
import argparse
import statistics

from course_utils.harness.strategies import STRATEGIES
from ddp_step_time import MODELS, step_time   # the same models and timing as the DDP benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="course,wide")
    args = ap.parse_args()
    # (strategy, its options, label): only zero3 has the overlap (prefetch) option
    variants = [("ddp", {"overlap": True}, "ddp"), ("zero3", {"overlap": True}, "zero3 prefetch"),
                ("zero3", {"overlap": False}, "zero3 no prefetch")]
    if "torch-fsdp" in STRATEGIES:
        variants.append(("torch-fsdp", {}, "torch-fsdp"))
    for name in args.models.split(","):
        config = MODELS[name]
        times = {label: [] for _, _, label in variants}
        for _ in range(args.repeat):
            for strategy, options, label in variants:
                times[label].append(step_time(strategy, config, args.ranks, args.steps, **options))
        med = {label: statistics.median(t) for label, t in times.items()}
        print(f"model {name} ({args.ranks} ranks, median of {args.repeat} runs x {args.steps} steps)")
        for _, _, label in variants:
            fsdp = f"   {med[label] / med['torch-fsdp']:5.2f}x torch-fsdp" if "torch-fsdp" in med else ""
            print(f"  {label:<18} {med[label] * 1e3:8.1f} ms/step   {med[label] / med['ddp']:5.2f}x ddp{fsdp}")
        if "torch-fsdp" in med:
            ratio = med["zero3 prefetch"] / med["torch-fsdp"]
            print(f"  zero3 prefetch / torch-fsdp: {ratio:.2f}x ({'within' if ratio <= 1.3 else 'OVER'} 1.3x)")


if __name__ == "__main__":
    main()
