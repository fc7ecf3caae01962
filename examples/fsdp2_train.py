"""FSDP2 training in one file, torch only: the script to take to a cluster.

    torchrun --nproc-per-node 8 examples/fsdp2_train.py                  # a GPU node: NCCL, bf16
    torchrun --nproc-per-node 2 examples/fsdp2_train.py --steps 4        # no GPU: gloo on CPU
    torchrun ... --steps 20 --save-every 10 --ckpt ckpt/ ; torchrun ... --steps 40 --resume --ckpt ckpt/

Rank 0 prints one header line, then one line per step. Checkpoints go to ckpt/step-N, a new folder each
save (DCP warns when it overwrites one); --resume loads the highest N. Torch 2.10's gloo also prints
"[Gloo] Rank r is connected to ... peer ranks" from every rank as the group connects: not this script's.
"""
import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import distribute_tensor
from torch.utils.data import DistributedSampler


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


@torch.no_grad()
def init_weights(model):
    """GPT-2's init for any world size: each rank draws each full tensor (one at a time) and keeps its shard."""
    gen = torch.Generator().manual_seed(0)
    for name, p in model.named_parameters():
        full = torch.randn(p.shape, generator=gen) * 0.02 if p.ndim == 2 else torch.full(p.shape, float("weight" in name))
        p.copy_(distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in [("vocab", 64), ("dim", 64), ("heads", 4), ("layers", 2), ("seq", 32), ("batch", 8), ("rows", 512),
                          ("steps", 20), ("warmup", 5), ("lr", 3e-3), ("clip", 1.0), ("save-every", 0), ("ckpt", "ckpt")]:
        ap.add_argument(f"--{flag}", type=type(default), default=default)
    ap.add_argument("--fp32", action="store_true", help="no mixed precision (default: bf16 compute, fp32 reduce)")
    ap.add_argument("--resume", action="store_true", help="load --ckpt and continue from its step")
    args = ap.parse_args()

    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    use_gpu = torch.cuda.device_count() >= local_world          # NCCL needs one GPU per rank
    device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_gpu else "gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the world size {world}")
    # An explicit mesh on this rank's device: fully_shard's default mesh is CUDA whenever a GPU is visible.
    # On CPU nothing else is needed (no CPUOffloadPolicy: that moves shards to CPU between uses on a GPU run).
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=None if args.fp32 else torch.bfloat16, reduce_dtype=torch.float32)

    with torch.device("meta"):          # no memory yet: a model bigger than one GPU can be built
        model = GPT(args.vocab, args.dim, args.heads, args.layers, args.seq)
    for block in model.blocks:          # one all-gather / reduce-scatter per block, then the rest
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)       # each rank allocates its shards only, uninitialised
    init_weights(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    # warmup, then 1/sqrt(step): a function of the step alone, so --resume --steps N extends a run
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / args.warmup, (args.warmup / (s + 1)) ** 0.5))

    gen = torch.Generator().manual_seed(1)      # synthetic rows: x_t = start + stride * t (mod vocab)
    start, stride = torch.randint(args.vocab, (2, args.rows, 1), generator=gen)
    data = (start + (stride % 3 + 1) * torch.arange(args.seq + 1)) % args.vocab
    sampler = DistributedSampler(data, world, rank, shuffle=True, drop_last=True)
    per_rank = args.batch // world      # the global batch is the same for any world size
    if args.resume:                     # every rank reads only its own shards of the model and the optimizer
        saved = [int(d[5:]) for d in os.listdir(args.ckpt) if d.startswith("step-") and d[5:].isdigit()]
        if not saved:
            raise SystemExit(f"--resume: no step-N folder in --ckpt {args.ckpt}; save one with --save-every")
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "sched": sched}   # DCP calls sched.load_state_dict
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt, f"step-{max(saved)}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    step = sched.last_epoch             # the steps done: 0, or the checkpoint's
    if rank == 0:
        print(f"world {world} device {device.type} backend {dist.get_backend()} {'fp32' if args.fp32 else 'bf16'} "
              f"params {sum(p.numel() for p in model.parameters())} from step {step}", flush=True)

    while step < args.steps:
        epoch, i = divmod(step, len(sampler) // per_rank)
        sampler.set_epoch(epoch)        # a new shuffle each epoch, the same on every rank
        rows = data[list(sampler)[i * per_rank:(i + 1) * per_rank]].to(device)
        loss = F.cross_entropy(model(rows[:, :-1]).float().flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()                 # FSDP averages the gradients over the ranks
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)  # over all shards
        opt.step()
        opt.zero_grad()
        sched.step()
        step += 1
        dist.all_reduce(mean := loss.detach().clone())      # the global batch's loss (SUM: gloo has no AVG)
        if rank == 0:
            print(f"step {step} loss {mean.item() / world:.6f} grad_norm {norm.full_tensor().item():.4f}", flush=True)
        if args.save_every and step % args.save_every == 0:     # --ckpt: a folder every node can reach
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd, "sched": sched}, checkpoint_id=os.path.join(args.ckpt, f"step-{step}"))
    dist.barrier()                      # every rank done before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    print(end="", flush=True)           # then skip C++ static destruction, where a leftover gloo thread
    os._exit(0)                         # can abort a finished run (SIGABRT, about 1 run in 10 on CPU)
