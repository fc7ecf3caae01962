"""Kept at this import path for code written against it: :mod:`course_utils.theory.memory`."""
from .theory.memory import *  # noqa: F401,F403
from .theory.memory import __all__  # noqa: F401
