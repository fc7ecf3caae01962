"""SPOILERS: the builds' hints, all three levels of each, the answer's traces included. Close this
file and call ``hint("ddp")`` instead, which prints one level per call, when you are stuck."""

#: build exercise -> its hints, one per call of :func:`hint`: where to start (the questions to ask),
#: what each piece is, then how, as a trace; said as a trace or a shape, never as the answer's code
HINTS = {
    "ddp": ("""MyDDP, where to start: __init__, then check_ddp says what it sees next.
  - __init__ has three jobs, in this order: every rank's model made equal to rank 0's; the trainable
    parameters cut into buckets in the order backward produces their gradients (the cell imports a
    helper for it); a hook on each trainable parameter that calls self._on_grad.
  - the hooks run one at a time, with memory between calls: decide what state says which bucket
    goes next, which gradients are in and what is in flight, before writing _on_grad.""",
            """MyDDP, what each piece is, __init__ first:
  - the same start: dist.broadcast each parameter and buffer (their .data) from rank 0;
  - the buckets: make_buckets(trainable parameters, bucket_bytes) gives lists in backward's order;
  - the hooks' state: which bucket goes next, which parameters have their gradient, what is in
    flight (bucket, flat tensor, work handle), whether _finish is queued for this backward;
  - a hook per trainable parameter: register_post_accumulate_grad_hook, with self._on_grad.""",
            """MyDDP, how the hook and the callback go, traced with buckets [[p3, p2], [p1, p0]]:
  hook(p3): first hook of this backward -> queue _finish (queue_backward_callback), once; p3 ready;
            bucket 0 = [p3, p2] is not all ready -> launch nothing
  hook(p2): bucket 0 is all ready -> launch it: torch.cat its .grads (zeros for a None) into one
            flat tensor, dist.all_reduce(flat, async_op=True), keep (bucket, flat, work), move on;
            bucket 1 is not complete -> stop (a `while`: when gradients arrive out of order,
            one hook can complete several buckets)
  hook(p1), hook(p0): the same; p0 completes bucket 1 -> launch it
  _finish: launch what is left (a frozen or unused parameter never fires a hook); for each
            (bucket, flat, work): wait, divide by the world size, split flat by the parameters'
            numel back into their .grad (view_as); then reset the state for the next backward."""),
    "zero1": ("""MyZero1, where to start: __init__, one parameter group at a time.
  - section 4's cell did every piece on 2 ranks: a flat padded buffer that the parameters view,
    this rank's slice of it, an inner optimizer that sees only that slice;
  - for each piece ask: a copy or a view? seen by autograd or not? step() depends on the answers.""",
              """MyZero1, what each piece is, per parameter group:
  - flatten_and_pad(the group's trainable parameters, detached, N): one buffer (outside autograd); make each parameter a view
    of its piece (p.data = a slice of it, view_as(p)): the all-gather then updates the model;
  - shard_bounds(Ψ of the group, N, rank): this rank's [lo, hi); the shard is an nn.Parameter over
    that slice of the buffer (a view, no copy), with a zeroed .grad the step will fill;
  - the inner optimizer: built once, over a list of groups, {**hyper(group), "params": [shard]}.""",
              """MyZero1, how step goes, per flat buffer: the .grads flattened and padded the same way (zeros for a
  None); reduce_scatter_tensor(shard's .grad, that flat gradient): a SUM, so divide by N; copy
  hyper(group) into the matching inner group (a scheduler changes yours); then one
  self.inner.step(); then one all-gather per flat buffer, in place: its input is this rank's own
  slice of the buffer, its output the whole buffer, no copy needed; the views now read every
  rank's update."""),
    "mixed": ("""MyMixedZero1, where to start: your MyZero1, copied. Two things change:
  - which dtype each buffer has (the model's parameters, the optimizer's masters, the gradients);
  - where the fp32 master comes from, and when: a master taken after rounding to bf16 has already
    lost what it is there to keep.""",
              """MyMixedZero1, what changes, and in which order:
  - in __init__, flatten and pad in fp32 first; the master is an nn.Parameter holding a .clone() of
    this rank's slice of that fp32 buffer; only then convert the buffer to bf16 (.to(torch.bfloat16))
    and make the parameters views of the bf16 one; the inner optimizer gets the masters;
  - the bf16 buffer is what the all-gather fills, so keep it, and the slice bounds, per group.""",
              """MyMixedZero1, how step goes, per group: flatten and pad the bf16 .grads; reduce-scatter them
  into a bf16 tensor of this rank's slice size; the master's .grad is that tensor as fp32 (.float())
  divided by N; copy the group's hyperparameters in; one self.inner.step(); then write each master into
  this rank's slice of its bf16 buffer (an assignment rounds it) and all-gather the buffer in place.
  The master keeps every small update; the bf16 parameters only show it once it adds up."""),
    "zero2": ("""MyZero2, where to start: the two small methods and __init__'s one addition, then check_zero2.
  - _grad_buffers decides the only gradient memory a bucket keeps: the tensor step() divides must be
    the one the inner optimizer reads;
  - _sum_gradients: once the hooks have sent everything during backward, what is left for step()?""",
              """MyZero2, what __init__ and the two small methods do:
  - __init__: after ZeRO-1's __init__ (self.buckets exists), the hooks go on:
    self.register_bucket_hooks with the list of each bucket's .params; nothing in flight yet;
  - _grad_buffers(bucket): one zeroed tensor the size of the shard, set as both bucket.shard_grad
    and bucket.shard.grad (the same tensor: step() divides one, the inner optimizer reads the other);
  - _zero_grads(bucket): that tensor zeroed, and every p.grad of the bucket None;
  - _sum_gradients: ZeRO-1's would reduce-scatter again in step(); the hooks already did.""",
              """MyZero2, how _launch and _finish go:
  _launch: first wait for the message still in flight (if any) and add its slice into its
            bucket's shard_grad; then the bucket's .grads flattened and padded (zeros for a None)
            into bucket.message; every p.grad = None (the memory ZeRO-2 saves); start
            reduce_scatter_tensor(message[lo:hi], message, async_op=True): the output is this
            rank's piece of the message itself; remember it as in flight; move self.next on.
  _finish: not queued any more; launch what is left; wait for the last one the same way; reset
            self.next and self.ready. ADD into shard_grad (micro-batches accumulate); zero it in
            _zero_grads, with every p.grad = None."""),
    "zero3": ("""MyFlatUnit, where to start: __init__, notebook 04's flat layout once more; then gather() and free().
  - ask what must survive a free(): the parameters' views of the flat buffer, or this rank's shard?
    One of them has to be a copy;
  - section 4's first cell showed the two tools that free a buffer and refill it while the views
    of it (and what autograd saved from them) stay valid.""",
              """MyFlatUnit, what each piece is: __init__ is notebook 04's layout once more, with two changes:
  self.full holds the unit's trainable parameters, padded to a multiple of N (padded_numel), each
  parameter a view of its piece; self.shard is a COPY (.clone()) of chunk `rank`, since self.full
  will be freed; end with self.free() and a hook per parameter. gather() is alloc_storage, then an
  all-gather of every rank's shard (detached) into self.full; free() is free_storage: always
  the same tensor, so the views, and what autograd saved from them, see what a gather writes.""",
              """MyFlatUnit, the piece that trips people up: backward needs the weights after forward freed
them. forward: gather(); out = the module's output; free(); then out.register_hook(fn) and return
out. Autograd calls fn(grad) when out's gradient arrives, just before this unit's own backward: fn
gathers again and returns grad unchanged. Because the parameters are views of the same self.full,
refilling it refills what autograd saved in forward (section 4's cell showed it).
_grad_ready: count the calls; at len(self.params), reduce_scatter(): the .grads flattened into
self.padded elements (zeros for a None), reduce_scatter_tensor into a shard-sized tensor, divide by
N, ADD it to self.shard.grad if there is one; every p.grad = None, the count back to 0, free."""),
    "prefetch": ("""MyPrefetchUnit, where to start: what changes between a gather that waits and one that does not?
  - an all-gather started with async_op=True returns a handle at once; the data is there only once
    that handle is waited for (notebook 02's DDP did the same with its all-reduces);
  - the model around your units decides when to call prefetch(); your unit only has to remember
    what is on its way, and gather() has to know about it.""",
                 """MyPrefetchUnit, what each piece is:
  - __init__: your MyFlatUnit's, then nothing on its way (None);
  - prefetch(): if nothing is on its way and self.full has no memory (freed), give it its memory back
    and start the all-gather of every rank's shard into it, keeping the handle;
  - gather(): two cases: a handle is kept (wait on it, then forget it), or none is (your MyFlatUnit's
    own gather, via super());
  - leave free() as it is: MyFlatUnit's __init__ calls it before your __init__ has set anything.""",
                 """MyPrefetchUnit, traced on two blocks, b0 then b1, in forward:
  before b0 computes:  b0.prefetch() starts b0's all-gather; b1.prefetch() starts b1's
  b0.forward:          gather() waits for b0's handle, forgets it; b0 computes (b1's travels); free()
  before b1 computes:  b1.prefetch(): on its way already, nothing
  b1.forward:          gather() waits for b1's handle (long arrived), forgets it; computes; free()
In backward the model calls b1.prefetch() when the loss's gradient arrives, and b0.prefetch() right
after b1's own hook re-gathered b1: the same two cases of gather(). A handle not forgotten would
make the next gather() wait on the old one and gather nothing."""),
}
