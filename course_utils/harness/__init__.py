"""Training and measuring any strategy the same way: the course model and data, the
strategy table, ``wrap``/``run`` and the one training loop, precision recipes,
checkpoints and the torchrun script."""
