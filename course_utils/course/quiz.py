"""Self-graded quizzes (notebook 00; every notebook ends with one): :func:`show` displays a
widget form (a text form where widgets cannot render), ``check("00", 2, "b")`` grades from
code. Any input gets a friendly message, never a traceback."""
from __future__ import annotations

import dataclasses

from .questions import Feedback, MultiChoice, Numeric, Question, Quiz, SingleChoice
from .quizbank import QUIZZES

__all__ = ["Feedback", "Question", "SingleChoice", "MultiChoice", "Numeric", "Quiz",
           "show", "check", "get"]


def get(quiz) -> Quiz:
    """A :class:`Quiz` from itself or a notebook number such as ``"00"``."""
    if isinstance(quiz, Quiz):
        return quiz
    key = f"{quiz:02d}" if isinstance(quiz, int) and not isinstance(quiz, bool) else str(quiz)
    if key not in QUIZZES:
        raise ValueError(f"no quiz {quiz!r}; quizzes exist for notebooks {sorted(QUIZZES)}")
    return QUIZZES[key]()


def show(quiz):
    """Display a quiz (a :class:`Quiz` or a notebook number like ``"00"``)."""
    from IPython.display import display
    display(get(quiz).widget())


def check(quiz, number_or_answer, answer=dataclasses.MISSING) -> Feedback:
    """``check(quiz, 2, "b")``: question 2 of a quiz; ``check(question, "b")``: one :class:`Question`."""
    if isinstance(quiz, Question):
        if answer is not dataclasses.MISSING:
            raise TypeError("check(question, answer) takes one answer")
        return quiz.grade(number_or_answer)
    if answer is dataclasses.MISSING:
        raise TypeError("check(quiz, question_number, answer): the answer is missing")
    return get(quiz).check(number_or_answer, answer)
