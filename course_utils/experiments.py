"""Kept at this import path for code written against it: :mod:`course_utils.harness.experiments`
and the strategy table (:mod:`course_utils.harness.strategies`)."""
from .harness import experiments as _experiments
from .harness.experiments import *  # noqa: F401,F403
from .harness.strategies import STRATEGIES, Strategy, register_strategy, strategies  # noqa: F401
# exported here before they found their one home in the package
from .harness.model import rows_per_rank  # noqa: F401
from .impl.ddp import unwrap  # noqa: F401
from .runtime.fmt import max_abs_diff, max_rel_diff  # noqa: F401

__all__ = _experiments.__all__ + ["STRATEGIES", "Strategy", "register_strategy", "strategies",
                                  "rows_per_rank", "unwrap", "max_abs_diff", "max_rel_diff"]
