# Exercise 11.4 (appendix 11, the capstone): size it, then pick it. The course's answer.
from course_utils.course import exercises
from course_utils.theory import planner

STAGE = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3, "HSDP": 3}


# Part 1 (given in the notebook): the model states of notebooks 03-06
def states_gb_solution(s, strategy, offload):
    n = s.gpus_per_node if strategy == "HSDP" else s.gpus    # HSDP shards inside a node
    stage = STAGE[strategy]
    params = 2 * s.params / (n if stage >= 3 else 1)
    grads = 2 * s.params / (n if stage >= 2 else 1)
    optim = 12 * s.params / (n if stage >= 1 else 1)
    if offload != "none":                  # the optimizer step runs on the host
        optim, grads = 0, (0 if stage >= 2 else grads)
    if offload == "optimizer+params":
        params = grads = 0
    return (params + grads + optim) / 1e9


# Step 1: the first option that fits, cheapest first
def first_fit(s, strategies):
    for offload in ("none", "optimizer", "optimizer+params"):       # the dearest cost outermost
        for recompute in (False, True):
            for strategy in strategies:                             # less sharding first
                try:
                    choice = planner.Choice(strategy, offload, recompute)
                except ValueError:      # DDP offloads nothing; only ZeRO-3 and HSDP offload parameters
                    continue
                gb = states_gb_solution(s, strategy, offload) + s.other_gb(strategy, recompute)
                if gb <= s.gpu_mem_gb:
                    return choice, gb


# Step 2: with fewer NICs than GPUs per node, flat ZeRO-2/3 cross the nodes every micro-batch: last
def choose_solution(s):
    nics = s.gpus_per_node if s.nics_per_node is None else s.nics_per_node   # given: None is one per GPU
    if s.nodes > 1 and nics < s.gpus_per_node:
        return first_fit(s, ["DDP", "ZeRO-1", "HSDP"]) or first_fit(s, ["ZeRO-2", "ZeRO-3"])
    return first_fit(s, ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"])


exercises.check_capstone(choose_solution)
