"""Models computed from numbers alone: configs, memory, communication, time, plans.
Nothing here starts a process or imports ``torch.distributed``."""
