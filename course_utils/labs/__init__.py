"""The measured experiments of notebooks 02 and 05-08: when DDP's bucket all-reduces are
issued (overlap), gradient accumulation under each strategy, FSDP2's options and
wrapping, the grand comparison, HSDP, hangs, DeepSpeed configs."""
