"""The measured experiments of notebooks 01, 02 and 05-08, observing the classes of
``impl`` from outside: the collective demos and their timing, when DDP's bucket
all-reduces are issued (overlap), gradient accumulation under each strategy, ZeRO-3's
gathers and frees, FSDP2's options and wrapping, the grand comparison, HSDP, hangs,
DeepSpeed configs; and the grading engine every exercise runs on (``grading``)."""
