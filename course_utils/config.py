"""Kept at this import path for code written against it: :mod:`course_utils.theory.config`."""
from .theory.config import *  # noqa: F401,F403
from .theory.config import __all__  # noqa: F401
