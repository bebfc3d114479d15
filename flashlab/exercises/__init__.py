"""Checkers for the book's coding exercises.

Each ``check_*`` function takes the reader's function, runs it on inputs it builds, and
returns a :class:`Feedback` that prints a specific hint for the common mistakes. The
chapters call them in their exercise cells; ``tests/test_exercises_*.py`` show that a correct
solution passes and that each planted mistake is caught with its message.
"""
from . import foundations, rect
from ._capstone import check_flash_tile_loop
from ._core import Feedback, Mistake, call_student, diagnose
from .foundations import *  # noqa: F401,F403  (the Foundations chapters' checkers)
from .rect import *  # noqa: F401,F403  (the RECT-FA chapters' checkers)

__all__ = ["Feedback", "Mistake", "call_student", "diagnose", "check_flash_tile_loop",
           *foundations.__all__, *rect.__all__]
