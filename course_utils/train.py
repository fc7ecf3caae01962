"""``python -m course_utils.train`` (and ``torchrun ... -m course_utils.train``): the training
script of :mod:`course_utils.harness.train`, under the short name its command lines use."""
from .harness.train import main

if __name__ == "__main__":
    raise SystemExit(main())
