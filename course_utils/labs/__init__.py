"""The measured experiments of notebooks 07 and 08: FSDP2's options and wrapping, the
grand comparison, HSDP, hangs, DeepSpeed configs."""
