"""ZeRO to FSDP: the one shared package the course's notebooks import.

Modules (each names the notebook that teaches it):
``env`` (where am I running), ``launch`` (run a function on N ranks), ``magics``
(``%%ranks N``), ``quiz`` + ``quizbank`` (self-graded questions), ``exercises``
(auto-graders), ``figures`` (the figures in ``vis/``), ``badges`` (Colab links);
``config`` (transformer configs and presets), ``memory`` (bytes per GPU: model states,
offload, activations), ``comm`` (bytes each collective sends), ``estimators``
(DeepSpeed's, accelerate's and the paper's estimates side by side), ``calculator``
(the memory widget), ``model`` (the course GPT and its data), ``precision`` (training
recipes measured to the byte).

Importing the package inside IPython registers the ``%%ranks`` cell magic.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .compat import require_supported_torch as _require_supported_torch

_require_supported_torch()      # an older torch: one sentence naming the one to install


def load_ipython_extension(ipython) -> None:
    """``%load_ext course_utils``: register the ``%%ranks`` magic."""
    from .magics import register

    register(ipython)


def _autoregister() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        load_ipython_extension(ip)


_autoregister()
