"""The gradient hooks of DDP and ZeRO-2 (``notebooks/02``'s ``_on_grad``, your MyDDP's): each
bucket sent, in order, as soon as its gradients are all in, and the rest when backward ends.
Its own module, apart from :mod:`.common`'s tools, which the DDP build imports: this is that
build's answer."""
from __future__ import annotations

from ..runtime.compat import queue_backward_callback

__all__ = ["BucketHooks"]


class BucketHooks:
    """DDP's and ZeRO-2's hooks: each marks its gradient ready and launches, strictly in
    order (the same collectives on every rank), each bucket whose gradients are all in; the
    first of a backward queues ``_finish``, which autograd runs when backward ends. A
    subclass calls :meth:`register_bucket_hooks` from its ``__init__`` and writes ``_launch``
    (send bucket ``self.next``, move on) and ``_finish``."""

    def register_bucket_hooks(self, buckets) -> None:
        """The hooks' state (``next`` bucket to launch, ``ready`` gradients, ``queued`` finish)
        and a gradient hook on every parameter of ``buckets`` (lists, in launch order)."""
        self.waiting = buckets            # the parameters of each bucket, in launch order
        self.next, self.ready, self.queued = 0, set(), False
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for b in buckets for p in b]

    def _on_grad(self, p) -> None:
        if not self.queued:               # once per backward: finish when it ends
            queue_backward_callback(self._finish)
            self.queued = True
        if id(p) in self.ready:
            raise RuntimeError("a gradient arrived twice in one backward (a parameter used by two "
                               "autograd graphs?); its bucket is sent once per backward")
        self.ready.add(id(p))
        while self.next < len(self.waiting) and all(id(q) in self.ready for q in self.waiting[self.next]):
            self._launch()

    def remove_hooks(self) -> None:
        """Detach the gradient hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
