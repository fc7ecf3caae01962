"""Self-graded quizzes: multiple choice (one or several answers) and numeric answers.

Taught in ``notebooks/00_orientation.ipynb``; every notebook ends with one.

* In JupyterLab / Colab, :func:`show` displays an ipywidgets form: pick or type an
  answer, press *Check*, get instant feedback with the explanation and a running score.
* Where no widget can render (nbval, GitHub, a terminal) the same call shows a
  deterministic text form of the questions and never blocks.
* From code: ``quiz.check("00", 2, "b")`` returns a :class:`Feedback`; tests use it to
  grade right and wrong answers.

Any input (empty, not a number, not an option, out of range) gets a friendly message,
never a traceback. A quiz's numbers come from ``course_utils`` (see ``quizbank``).
"""
from __future__ import annotations

import dataclasses

from .questions import Feedback, MultiChoice, Numeric, Question, Quiz, SingleChoice
from .quizbank import QUIZZES

__all__ = ["Feedback", "Question", "SingleChoice", "MultiChoice", "Numeric", "Quiz",
           "show", "check", "get"]


# --------------------------------------------------------------------- module API

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
    """Grade an answer from code.

    ``check(quiz, 2, "b")`` grades question 2 of a quiz (a :class:`Quiz` or a notebook
    number like ``"00"``); ``check(question, "b")`` grades a single :class:`Question`.
    """
    if isinstance(quiz, Question):
        if answer is not dataclasses.MISSING:
            raise TypeError("check(question, answer) takes one answer")
        return quiz.grade(number_or_answer)
    if answer is dataclasses.MISSING:
        raise TypeError("check(quiz, question_number, answer): the answer is missing")
    return get(quiz).check(number_or_answer, answer)
