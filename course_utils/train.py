"""``python -m course_utils.train`` (and ``torchrun ... -m course_utils.train``): the training
script of :mod:`course_utils.harness.train`, under the short name its command lines use."""
from .harness.train import main, run_and_exit  # noqa: F401

if __name__ == "__main__":
    run_and_exit()
