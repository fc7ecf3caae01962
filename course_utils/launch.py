"""Kept at this import path for code written against it: :mod:`course_utils.runtime.launch`."""
from .runtime.launch import *  # noqa: F401,F403
from .runtime.launch import __all__  # noqa: F401
