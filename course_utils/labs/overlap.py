"""When DDP's bucket all-reduces are issued relative to backward (``notebooks/02_data_parallelism.ipynb``
§6): :class:`RecordedDDP` observes the course's ``DataParallel`` from outside; what follows
from the order of events is exact, the times are measured and never compared by tests.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch.distributed as dist

from ..checks import check_bool, check_int
from ..harness.experiments import make_adamw
from ..harness.model import SyntheticData, build_model, rows_per_rank
from ..impl.ddp import DataParallel
from ..runtime.launch import launch, rank_device

__all__ = ["BUCKET_BYTES", "RecordedDDP", "StepTimeline", "ddp_step_timeline", "plot_timelines"]

#: Buckets closed once they hold 64 KiB: the course GPT's 517,400 B of fp32 gradients make 7, so
#: there is something to overlap (torch DDP's 25 MiB default holds the whole model in one).
BUCKET_BYTES = 64 * 1024
GLOBAL_BATCH = 12
TIMEOUT_S = 120


@dataclasses.dataclass
class StepTimeline:
    """One rank's record of one DDP backward; times in seconds after ``loss.backward()``."""
    rank: int
    world_size: int
    overlap: bool
    bucket_bytes: int
    bucket_numels: list            # elements per bucket, in launch order (exact)
    num_grads: int                 # gradient hooks per backward (exact)
    launched_after: list           # per bucket: gradients ready when it was launched (exact)
    during_backward: list          # per bucket: launched from a hook, not at the end (exact)
    grad_ready_s: list             # per hook, in firing order (measured)
    launch_s: list                 # per bucket (measured)
    done_s: list                   # per bucket, its all-reduce completed; None if unknown (measured)
    backward_end_s: float          # autograd reached the end-of-backward callback (measured)
    synced_s: float                # every .grad holds the average (measured)
    forward_s: float               # the forward before it took this long (measured)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_numels)

    def still_to_come(self) -> list:
        """Per bucket: gradients backward had yet to compute when it was launched (exact)."""
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

    def hidden_s(self) -> float:
        """Seconds of all-reduce that ran before backward ended (measured)."""
        return sum(max(0.0, min(done, self.backward_end_s) - start)
                   for start, done in zip(self.launch_s, self.done_s) if done is not None)


class RecordedDDP(DataParallel):
    """:class:`DataParallel` that writes down when things happen in a backward run inside
    :meth:`record`; it computes and sends exactly what :class:`DataParallel` does."""
    rec = None

    @contextlib.contextmanager
    def record(self):
        """Yields the record: ``launch`` per bucket is ``(time, gradients ready, from a hook)``."""
        self.rec = {"grads": [], "launch": [], "done": {}, "end": None, "synced": None, "futures": []}
        try:
            yield self.rec
        finally:
            for f in self.rec.pop("futures"):        # every completion callback has run
                f.wait()
            self.rec = None

    def _on_grad(self, p) -> None:
        if self.rec is not None:
            self.rec["grads"].append(time.perf_counter())
        super()._on_grad(p)

    def _launch(self) -> None:
        index = self.next
        super()._launch()
        if self.rec is None:
            return
        self.rec["launch"].append((time.perf_counter(), len(self.rec["grads"]), self.rec["end"] is None))
        done = self.rec["done"]
        try:
            future = self.pending[-1][2].get_future()
        except (AttributeError, RuntimeError, NotImplementedError):
            return                                   # a backend without futures: no completion time
        self.rec["futures"].append(future.then(lambda _f: done.setdefault(index, time.perf_counter())))

    def _finish(self) -> None:
        if self.rec is not None:
            self.rec["end"] = time.perf_counter()
        super()._finish()
        if self.rec is not None:
            self.rec["synced"] = time.perf_counter()


def _record_step(overlap: bool, bucket_bytes: int, warmup: int, seed: int) -> StepTimeline:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    model = RecordedDDP(build_model(seed=seed, device=device), bucket_bytes, overlap=overlap)
    optimizer = make_adamw(model.params)
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=seed)
    for step in range(warmup + 1):
        x, y = (t.to(device) for t in data.shard(step, rank, world))
        t_forward = time.perf_counter()
        loss = model(x, y)
        t0 = time.perf_counter()
        with model.record() if step == warmup else contextlib.nullcontext() as rec:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    launches = rec["launch"]
    return StepTimeline(rank=rank, world_size=world, overlap=overlap, bucket_bytes=bucket_bytes,
                        bucket_numels=[sum(p.numel() for p in b) for b in model.buckets],
                        num_grads=len(model.params), launched_after=[n for _, n, _ in launches],
                        during_backward=[hook for _, _, hook in launches],
                        grad_ready_s=[t - t0 for t in rec["grads"]], launch_s=[t - t0 for t, _, _ in launches],
                        done_s=[rec["done"][i] - t0 if i in rec["done"] else None for i in range(len(launches))],
                        backward_end_s=rec["end"] - t0, synced_s=rec["synced"] - t0, forward_s=t0 - t_forward)


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


def plot_timelines(timelines: dict):
    """One panel per labelled :class:`StepTimeline` on one time axis; returns the Figure."""
    from matplotlib.figure import Figure
    if not isinstance(timelines, dict) or not timelines or \
            not all(isinstance(t, StepTimeline) for t in timelines.values()):
        raise TypeError("timelines must be a non-empty dict of label -> StepTimeline "
                        "(what ddp_step_timeline returns, one rank's)")
    fig = Figure(figsize=(9.0, 1.2 + 1.9 * len(timelines)))
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False)[:, 0]
    end = max(max(t.synced_s, *(d for d in t.done_s if d is not None)) for t in timelines.values())
    for ax, (label, tl) in zip(axes, timelines.items()):
        ms = [1e3 * t for t in tl.grad_ready_s]
        ax.axvspan(0, 1e3 * tl.backward_end_s, color="#DD8452", alpha=0.15, label="backward computing")
        ax.vlines(ms, -0.4, 0.4, color="#DD8452", linewidth=1)
        rows = range(1, tl.num_buckets + 1)
        for row, start, done in zip(rows, tl.launch_s, tl.done_s):
            stop = done if done is not None else tl.synced_s
            ax.barh(row, 1e3 * (stop - start), left=1e3 * start, height=0.6, color="#4C72B0")
        # an all-reduce of a few tens of KiB can take microseconds: mark each launch too
        ax.plot([1e3 * t for t in tl.launch_s], list(rows), ">", color="#4C72B0", markersize=5,
                label="a bucket's all-reduce launched (bar: until it completed)" if ax is axes[0] else None)
        ax.axvline(1e3 * tl.synced_s, color="#333333", linestyle=":", linewidth=1,
                   label="backward() returns: every .grad averaged")
        ax.set_yticks([0, *rows], ["gradient hooks", *(f"bucket {r}" for r in rows)], fontsize=7)
        ax.invert_yaxis()
        hooked = sum(tl.during_backward)
        ax.set_title(f"{label}: {hooked} of {tl.num_buckets} all-reduces launched during backward "
                     f"(rank {tl.rank} of {tl.world_size})", fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=7,
               frameon=False)
    axes[-1].set_xlim(0, 1e3 * end * 1.03)
    axes[-1].set_xlabel("ms after loss.backward() was called (measured, this machine)", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    return fig
