"""The implementations a learner studies: collectives, the ring, DDP, ZeRO-1/2, ZeRO-3,
and PyTorch's FSDP2 and HSDP wrapped the same way."""
