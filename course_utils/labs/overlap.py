"""When DDP's bucket all-reduces are issued relative to backward (``notebooks/02_data_parallelism.ipynb``
§6): :class:`RecordedDDP` observes the course's ``DataParallel`` from outside. What it records
follows from the order of events, so it is exact on every machine; what overlap buys in time
is :mod:`course_utils.labs.clock`'s (§7).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch.distributed as dist

from ..checks import check_bool, check_int
from ..harness.experiments import make_adamw
from ..harness.model import SyntheticData, build_model, rows_per_rank
from ..impl.ddp import DataParallel
from ..runtime.launch import launch, rank_device

__all__ = ["BUCKET_BYTES", "RecordedDDP", "StepTimeline", "ddp_step_timeline"]

#: Buckets closed once they hold 64 KiB: the course GPT's 517,400 B of fp32 gradients make 7, so
#: there is something to overlap (torch DDP's 25 MiB default holds the whole model in one).
BUCKET_BYTES = 64 * 1024
GLOBAL_BATCH = 12
TIMEOUT_S = 120


@dataclasses.dataclass
class StepTimeline:
    """One rank's record of one DDP backward: which bucket left when, all exact."""
    rank: int
    world_size: int
    overlap: bool
    bucket_bytes: int
    bucket_numels: list            # elements per bucket, in launch order
    num_grads: int                 # gradient hooks per backward
    launched_after: list           # per bucket: gradients ready when it was launched
    during_backward: list          # per bucket: launched from a hook, not at the end

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_numels)

    def still_to_come(self) -> list:
        """Per bucket: gradients backward had yet to compute when it was launched."""
        return [self.num_grads - n for n in self.launched_after]

    def describe(self) -> str:
        lines = [f"overlap={self.overlap}: {self.num_buckets} buckets (each closed once it holds "
                 f"{self.bucket_bytes:,} B), {self.num_grads} gradient hooks per backward"]
        for i, (numel, left, hook) in enumerate(zip(self.bucket_numels, self.still_to_come(),
                                                    self.during_backward)):
            when = "from a hook, during backward" if hook else "at the end of backward"
            lines.append(f"  bucket {i + 1} of {self.num_buckets} ({numel:>6,} elements): launched {when}, "
                         f"{left:>2} of {self.num_grads} gradients still to compute")
        return "\n".join(lines)


class RecordedDDP(DataParallel):
    """:class:`DataParallel` that writes down the order of events of a backward run inside
    :meth:`record`; it computes and sends exactly what :class:`DataParallel` does."""
    rec = None

    @contextlib.contextmanager
    def record(self):
        """Yields the record: ``grads`` (hooks fired), ``launch`` per bucket ``(gradients ready,
        from a hook)``, ``ended`` (backward reached its end-of-backward callback)."""
        self.rec = {"grads": 0, "launch": [], "ended": False}
        try:
            yield self.rec
        finally:
            self.rec = None

    def _on_grad(self, p) -> None:
        if self.rec is not None:
            self.rec["grads"] += 1
        super()._on_grad(p)

    def _launch(self) -> None:
        super()._launch()
        if self.rec is not None:
            self.rec["launch"].append((self.rec["grads"], not self.rec["ended"]))

    def _finish(self) -> None:
        if self.rec is not None:
            self.rec["ended"] = True
        super()._finish()


def _record_step(overlap: bool, bucket_bytes: int, warmup: int, seed: int) -> StepTimeline:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    model = RecordedDDP(build_model(seed=seed, device=device), bucket_bytes, overlap=overlap)
    optimizer = make_adamw(model.params)
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=seed)
    for step in range(warmup + 1):
        x, y = (t.to(device) for t in data.shard(step, rank, world))
        loss = model(x, y)
        with model.record() if step == warmup else contextlib.nullcontext() as rec:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return StepTimeline(rank=rank, world_size=world, overlap=overlap, bucket_bytes=bucket_bytes,
                        bucket_numels=[sum(p.numel() for p in b) for b in model.buckets],
                        num_grads=len(model.params), launched_after=[n for n, _ in rec["launch"]],
                        during_backward=[hook for _, hook in rec["launch"]])


def ddp_step_timeline(world_size: int = 2, *, overlap: bool = True, bucket_bytes: int = BUCKET_BYTES,
                      warmup: int = 2, seed: int = 0, quiet: bool = True,
                      timeout_s: float = TIMEOUT_S) -> list[StepTimeline]:
    """Each rank's :class:`StepTimeline` of one recorded step after ``warmup`` steps;
    ``overlap=False`` launches every bucket when backward ends."""
    check_int("world_size", world_size, 2, what="ranks; one rank sends nothing")
    check_int("bucket_bytes", bucket_bytes, 0)
    check_int("warmup", warmup, 0)
    check_int("seed", seed, 0)
    check_bool("overlap", overlap)
    rows_per_rank(GLOBAL_BATCH, world_size)
    return list(launch(_record_step, world_size, overlap, bucket_bytes, warmup, seed,
                       quiet=quiet, timeout_s=timeout_s))
