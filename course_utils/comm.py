"""Kept at this import path for code written against it: the communication model
(:mod:`course_utils.theory.comm`), the ledger (:mod:`course_utils.runtime.ledger`, the ring
model of each call) and the wire meter (:mod:`course_utils.runtime.wire`, measured)."""
from .runtime import ledger as _ledger
from .runtime import wire as _wire
from .runtime.ledger import *  # noqa: F401,F403
from .runtime.wire import *  # noqa: F401,F403
from .theory import comm as _comm
from .theory.comm import *  # noqa: F401,F403

__all__ = _comm.__all__ + _ledger.__all__ + _wire.__all__
