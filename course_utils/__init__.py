"""ZeRO to FSDP: the one shared package the course's notebooks import.

The subpackages, each allowed to import only those above it in this list:

``checks``
    argument checks shared by everything (a clear ``TypeError``/``ValueError``).
``theory``
    arithmetic models, no distributed code: transformer ``config`` and presets, ``memory``
    (bytes per GPU), ``comm`` (bytes each collective sends), ``alpha_beta`` (its time),
    ``layout`` (padding and shards), ``timeline`` (ZeRO-3's memory over a step),
    ``scaling``, ``multinode``, ``estimators``, ``planner`` (with ``plan_types``), ``gpt2xl``
    (the planner against a published run). Nothing here draws.
``runtime``
    running code on N ranks and watching it: ``launch``, ``magics`` (``%%ranks``),
    ``env``, ``ledger`` (every collective recorded), ``compat`` (torch versions), ``fmt``.
``impl``
    what the learner studies, one file each: ``collectives``, ``ring``, ``ddp``,
    ``zero`` (stages 1-2), ``zero3``, ``fsdp``, ``hsdp``; ``common`` holds what they share.
``harness``
    training and measuring any of them: the course ``model`` and data, the
    ``strategies`` table and its adapters (``probes``), ``experiments`` (``wrap``, ``run``, the training loop),
    ``precision``, ``checkpoint``, ``train_cli`` (the torchrun script).
``labs``
    the experiments of notebooks 02 and 05-08: ``overlap``, ``accumulation``,
    ``fsdp_api``, ``fsdp_wrapping``, ``comparison``, ``hsdp_lab``, ``hangs``, ``deepspeed_config``;
    ``grading``, the engine of every exercise (``hangs`` grades one, ``course.exercises`` the rest).
``course``
    the course around them: ``quiz``, ``questions``, ``quizbank``, ``exercises`` (one
    module per notebook), ``figures``, ``plots`` (the theory models drawn), ``calculator``
    (widgets, shown through ``widgets``), ``benchmark`` (published runs), ``badges``, ``book``, ``paths``.

``memory``, ``comm``, ``launch``, ``experiments`` and ``config`` at the top are the same
code under the import paths used before the subpackages existed.
Importing the package inside IPython registers the ``%%ranks`` cell magic.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .runtime.compat import require_supported_torch as _require_supported_torch

_require_supported_torch()      # an older torch: one sentence naming the one to install

from .runtime.launch import register_forkserver_preload as _register_forkserver_preload

# What the notebooks' ranks import, loaded once by the forkserver (runtime names no layer above it)
_register_forkserver_preload("course_utils.harness.experiments", "course_utils.harness.model",
                             "course_utils.labs.collectives_lab", "course_utils.impl.zero3",
                             "course_utils.harness.strategies")


def load_ipython_extension(ipython) -> None:
    """``%load_ext course_utils``: register the ``%%ranks`` magic."""
    from .runtime.magics import register
    register(ipython)


def _autoregister() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    if (ip := get_ipython()) is not None:
        load_ipython_extension(ip)


_autoregister()
