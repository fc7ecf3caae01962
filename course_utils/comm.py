"""Kept at this import path for code written against it: the communication model
(:mod:`course_utils.theory.comm`) and the ledger (:mod:`course_utils.runtime.ledger`)."""
from .runtime import ledger as _ledger
from .runtime.ledger import *  # noqa: F401,F403
from .theory import comm as _comm
from .theory.comm import *  # noqa: F401,F403

__all__ = _comm.__all__ + _ledger.__all__
