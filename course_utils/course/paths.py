"""The one place the GitHub ``owner/repo`` is written: change it, then ``make badges``."""
GITHUB_REPO = "zero-to-fsdp/zero-to-fsdp"
BRANCH = "main"

# The notebook sequence: file name, title, one line for the README table.
NOTEBOOKS = [
    ("00_orientation.ipynb", "Orientation",
     "Your environment, how a demo cell runs N real processes, quizzes and exercises."),
    ("01_collectives.ipynb", "Collectives",
     "Broadcast, all-reduce, reduce-scatter, all-gather on live ranks; the bytes each rank sends "
     "(the ring algorithm), counted and measured, and the time they take."),
    ("02_data_parallelism.ipynb", "Data parallelism",
     "DDP from scratch and torch DDP give the single-process losses; accumulation, bucketing, "
     "overlap; you build DDP yourself, graded on 2-4 ranks."),
    ("03_memory_anatomy.ipynb", "Where the memory goes",
     "Params, grads, optimizer states and activations per GPU, stage by stage; the calculator widget."),
    ("04_zero1.ipynb", "ZeRO-1",
     "Optimizer-state sharding: flat buffer, reduce-scatter, sharded Adam, all-gather; you build "
     "ZeRO-1 as a torch optimizer, graded on 2-4 ranks."),
    ("05_zero2.ipynb", "ZeRO-2",
     "Gradient sharding during backward; peak gradient memory measured; accumulation; optionally, "
     "you join ZeRO-1 and DDP's hooks into ZeRO-2, graded on 2-4 ranks."),
    ("06_zero3.ipynb", "ZeRO-3",
     "Parameter sharding: gather, compute, free; you build a ZeRO-3 unit (a block gathered and freed "
     "as a whole), graded on 2-4 ranks, then "
     "run the whole course model on your units, measured and timed; sending 1.5x the bytes of DDP; "
     "prefetching (the next unit gathered early), on the clock."),
    ("07_fsdp.ipynb", "FSDP in PyTorch",
     "PyTorch's FSDP2 (fully_shard) on the course model: wrapping, mixed precision, CPU offload "
     "(states kept in host memory), checkpoints."),
    ("08_beyond_one_box.ipynb", "Beyond one box",
     "Hybrid sharding (sharded inside a node, replicated across), and when it beats full sharding, "
     "in bytes and on the clock; choosing a strategy "
     "for a cluster; torchrun on several nodes; finding where a job hangs."),
    ("09_appendix_forensics.ipynb", "Appendix: published runs",
     "Optional: what accumulation and more GPUs cost in a published gpt2-xl benchmark, the planner "
     "against its every figure, Megatron's distributed optimizer, why memory estimators disagree, "
     "activations term by term, the model states measured to the byte."),
    ("10_appendix_fsdp_in_depth.ipynb", "Appendix: FSDP in depth",
     "Optional: FSDP1's names in detail, the options' finer points, checkpoint internals, three "
     "common problems fixed, every strategy of the course side by side."),
    ("11_appendix_at_scale.ipynb", "Appendix: at scale, in depth",
     "Optional: the multi-node time model, choosing a strategy with the planner (its assumptions, a "
     "widget, the capstone), a DeepSpeed config next to torch's in full, more hangs."),
    ("12_appendix_zero3_in_depth.ipynb", "Appendix: ZeRO-3 in depth",
     "Optional: ZeRO-3's bytes unit by unit and on gloo's wire, the root freed after forward, a 7B "
     "model's count, gradient accumulation, ZeRO-3 next to tensor parallelism, and LoRA on a frozen "
     "base: its bytes per rank under each strategy, and what sharding the base costs in gathers."),
    ("13_appendix_claims.ipynb", "Appendix: claims you will meet, checked",
     "Optional: widely repeated figures about ZeRO and FSDP, each with the right figure and the cell "
     "that computes it."),
    ("14_appendix_optional_builds.ipynb", "Appendix: more builds",
     "Optional: three more builds: a ring all-reduce from sends and receives, ZeRO-1 in mixed precision "
     "(K = 12), prefetch in your ZeRO-3 units (timed); each graded on 2-4 ranks."),
]

#: Optional notebooks after the sequence: the full skeleton, but no quiz.
APPENDICES = ("09_appendix_forensics.ipynb", "10_appendix_fsdp_in_depth.ipynb", "11_appendix_at_scale.ipynb",
              "12_appendix_zero3_in_depth.ipynb", "13_appendix_claims.ipynb", "14_appendix_optional_builds.ipynb")


def colab_url(notebook: str) -> str:
    return f"https://colab.research.google.com/github/{GITHUB_REPO}/blob/{BRANCH}/notebooks/{notebook}"


def colab_badge(notebook: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(notebook)})")
