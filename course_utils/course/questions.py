"""Quiz question types and the quiz form (ipywidgets where widgets render, text elsewhere)."""
from __future__ import annotations

import dataclasses
import html
import math
import re
import string
from typing import Iterable, Sequence

from . import widgets

__all__ = ["Feedback", "Question", "SingleChoice", "MultiChoice", "Numeric", "Quiz", "KINDS"]

LETTERS = string.ascii_lowercase
# What a question asks: recall (its answer is printed in the notebook, or a direct plug into the
# formula just shown), or understanding: predict a setting not shown, compare two designs, explain why.
KINDS = ("recall", "predict", "compare", "explain")


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The verdict on one answer. ``correct`` is None when the input was not an answer."""
    correct: bool | None
    message: str

    @property
    def malformed(self) -> bool:
        return self.correct is None

    def __bool__(self) -> bool:
        return bool(self.correct)

    def __str__(self) -> str:
        mark = {True: "Correct.", False: "Not quite.", None: "Try again:"}[self.correct]
        return f"{mark} {self.message}".strip()


class Question:
    """Base class: ``prompt``, ``explanation`` and :meth:`grade`. ``kind``: one of :data:`KINDS`;
    ``printed``: the notebook ("05") whose saved outputs the explanation quotes, if it does."""

    def __init__(self, prompt: str, explanation: str = "", *, kind: str = "recall",
                 printed: str | None = None):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("a question needs a non-empty prompt")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.prompt, self.explanation = prompt.strip(), explanation.strip()
        self.kind, self.printed = kind, printed

    def grade(self, answer) -> Feedback:  # pragma: no cover - abstract
        raise NotImplementedError

    def text(self) -> str:
        return self.prompt

    def _right(self, lead: str = "") -> Feedback:
        return Feedback(True, " ".join(x for x in (lead, self.explanation) if x))

    def _wrong(self, lead: str = "") -> Feedback:
        """Without the explanation: it gives the answer away."""
        return Feedback(False, " ".join(x for x in (lead, "Think again and try another answer.") if x))


class _Choice(Question):
    def __init__(self, prompt: str, options: Sequence[str], answer, explanation: str = "", **kw):
        super().__init__(prompt, explanation, **kw)
        if isinstance(options, str) or len(options) < 2:
            raise ValueError("a choice question needs a list of at least two options")
        if len(options) > len(LETTERS):
            raise ValueError("too many options")
        self.options = [str(o) for o in options]
        self.letters = LETTERS[: len(self.options)]
        picks, problem = self._parse(answer)
        if problem or not picks:
            raise ValueError(f"the answer key {answer!r} is not valid for these options: {problem}")
        self.answer = frozenset(picks)

    def _parse(self, raw) -> tuple[set[str], str]:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = [raw]
        if isinstance(raw, str):
            s = raw.strip()
            for i, opt in enumerate(self.options):  # the full text of an option
                if s.lower() == opt.lower():
                    return {self.letters[i]}, ""
            tokens = re.split(r"[\s,;/+]+|\band\b", s.lower())
            tokens = [t.strip("().") for t in tokens if t.strip("().")]
            if len(tokens) == 1 and len(tokens[0]) > 1 and set(tokens[0]) <= set(self.letters):
                tokens = list(tokens[0])  # "ac"
            raw = tokens
        if isinstance(raw, Iterable):
            picks = set()
            for item in raw:
                if isinstance(item, bool):
                    return set(), f"{item!r} is not an option"
                if isinstance(item, int):
                    if not 0 <= item < len(self.options):
                        return set(), f"option number {item} does not exist (0-{len(self.options) - 1})"
                    picks.add(self.letters[item])
                    continue
                token = str(item).strip().lower().strip("().")
                if token not in self.letters:
                    return set(), f"'{item}' is not an option"
                picks.add(token)
            return picks, "" if picks else "no answer given"
        if raw is None:
            return set(), "no answer given"
        return set(), f"an answer of type {type(raw).__name__} is not understood"

    def text(self) -> str:
        opts = "\n".join(f"   ({ch}) {opt}" for ch, opt in zip(self.letters, self.options))
        return f"{self.prompt}\n{opts}"

    def answer_text(self) -> str:
        return ", ".join(f"({c}) {o}" for c, o in zip(self.letters, self.options) if c in self.answer)


class SingleChoice(_Choice):
    """One right option. ``answer`` is its letter ("b") or index (1)."""

    def __init__(self, prompt, options, answer, explanation="", **kw):
        super().__init__(prompt, options, answer, explanation, **kw)
        if len(self.answer) != 1:
            raise ValueError("a SingleChoice question has exactly one right option")

    def grade(self, answer) -> Feedback:
        picks, problem = self._parse(answer)
        if problem or len(picks) > 1:
            return Feedback(None, f"{problem or 'this question has one answer'}; pick one of {', '.join(self.letters)}.")
        return self._right() if picks == self.answer else self._wrong()


class MultiChoice(_Choice):
    """Several right options (select all that apply). ``answer`` like "a,c" or [0, 2]."""

    def text(self) -> str:
        head, _, opts = super().text().partition("\n")
        return f"{head} (select all that apply)\n{opts}"

    def grade(self, answer) -> Feedback:
        picks, problem = self._parse(answer)
        if problem:
            return Feedback(None, f"{problem}; pick one or more of {', '.join(self.letters)}, e.g. 'a, c'.")
        if picks == self.answer:
            return self._right()
        missing, extra = len(self.answer - picks), len(picks - self.answer)
        bits = [f"{extra} of your picks {'is' if extra == 1 else 'are'} wrong"] * bool(extra) + [
            f"{missing} right option{'s are' if missing > 1 else ' is'} missing"] * bool(missing)
        return self._wrong("; ".join(bits).capitalize() + ".")


_NUMBER = re.compile(r"^[-+]?(\d[\d_,]*\.?\d*|\.\d+)(e[-+]?\d+)?$", re.IGNORECASE)


class Numeric(Question):
    """A number, right within ``tol`` (absolute) or ``rel_tol`` (relative), in ``unit``."""

    def __init__(self, prompt, answer: float, *, unit: str = "", tol: float | None = None,
                 rel_tol: float | None = None, minimum: float | None = None,
                 maximum: float | None = None, explanation: str = "", **kw):
        super().__init__(prompt, explanation, **kw)
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
            raise ValueError("a Numeric question's answer must be a finite number")
        rel_tol = 1e-6 if tol is None and rel_tol is None else rel_tol
        if (tol is not None and tol < 0) or (rel_tol is not None and rel_tol < 0):
            raise ValueError("tolerances must be >= 0")
        self.answer, self.unit, self.tol, self.rel_tol = float(answer), unit, tol, rel_tol
        self.minimum, self.maximum = minimum, maximum

    def _allowed(self) -> float:
        return max(self.tol or 0.0, (self.rel_tol or 0.0) * abs(self.answer))

    def text(self) -> str:
        return f"{self.prompt} (answer in {self.unit})" if self.unit else self.prompt

    def answer_text(self) -> str:
        allowed = self._allowed()
        within = f" (within ±{allowed:g})" if allowed > 1e-9 * max(1.0, abs(self.answer)) else ""
        return f"{self.answer:g}{' ' + self.unit if self.unit else ''}{within}"

    def parse(self, raw) -> tuple[float | None, str]:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None, "no answer given"
        if isinstance(raw, bool):
            return None, f"{raw!r} is not a number"
        if isinstance(raw, (int, float)):
            value = float(raw)
        else:
            s = str(raw).strip()
            if self.unit and s.lower().endswith(self.unit.lower()):
                s = s[: -len(self.unit)].strip()
            s = s.replace(" ", "")
            if not _NUMBER.match(s):
                return None, f"'{raw}' is not a number"
            if "," in s and "." not in s and not re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+", s):
                s = s.replace(",", ".", 1) if s.count(",") == 1 else s  # "28,5" -> 28.5
            value = float(s.replace(",", "").replace("_", ""))   # _NUMBER admits only floats
        if not math.isfinite(value):
            return None, "the answer must be a finite number"
        if self.minimum is not None and value < self.minimum:
            return None, f"{value:g} is below the smallest sensible answer ({self.minimum:g})"
        if self.maximum is not None and value > self.maximum:
            return None, f"{value:g} is above the largest sensible answer ({self.maximum:g})"
        return value, ""

    def grade(self, answer) -> Feedback:
        value, problem = self.parse(answer)
        unit = f" {self.unit}" if self.unit else ""
        if problem:
            return Feedback(None, f"{problem}; enter a number{' in' + unit if unit else ''}, e.g. 42 or 3.5e9.")
        if abs(value - self.answer) <= self._allowed():
            return self._right(f"{self.answer:g}{unit}.")
        direction = "high" if value > self.answer else "low"
        return self._wrong(f"{value:g}{unit} is too {direction}.")


class Quiz:
    """An ordered list of questions with a title; questions are numbered from 1."""

    def __init__(self, title: str, questions: Sequence[Question]):
        if not questions or not all(isinstance(q, Question) for q in questions):
            raise ValueError("a Quiz needs a non-empty list of Question objects")
        self.title, self.questions = title, list(questions)

    def __len__(self) -> int:
        return len(self.questions)

    def question(self, number: int) -> Question:
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= len(self):
            raise ValueError(f"question numbers run from 1 to {len(self)}, got {number!r}")
        return self.questions[number - 1]

    def check(self, number: int, answer) -> Feedback:
        return self.question(number).grade(answer)

    def text(self) -> str:
        lines = [f"Quiz: {self.title} ({len(self)} questions)"]
        for i, q in enumerate(self.questions, 1):
            lines.append("")
            first, *rest = q.text().split("\n")
            lines += [f"{i}. {first}", *rest]
        lines += ["", "Run this cell to answer in a form with instant feedback (JupyterLab or "
                     "Colab), or from code: quiz.check(<quiz>, <question number>, <answer>)."]
        return "\n".join(lines)

    def widget(self):
        return _QuizForm(self)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.widget()._repr_mimebundle_(include=include, exclude=exclude)

    def answers_html(self) -> str:
        """The quiz for the offline book: each answer and explanation behind a ``<details>`` click."""
        parts = [f"<div class='course-quiz'><p><b>Quiz: {_esc(self.title)}</b> "
                 f"({len(self)} questions): answer each, then open its answer.</p>"]
        for i, q in enumerate(self.questions, 1):
            first, *rest = q.text().split("\n")
            opts = "".join(f"<div>{_esc(line.strip())}</div>" for line in rest if line.strip())
            right = ([f"({c}) {o}" for c, o in zip(q.letters, q.options) if c in q.answer]
                     if isinstance(q, _Choice) else [q.answer_text()])   # each right option on its own line
            parts.append(
                f"<div class='course-quiz-question'><p><b>{i}.</b> {_esc(first)}</p>"
                + (f"<div class='course-quiz-options' style='margin-left:1.5em'>{opts}</div>" if opts else "")
                + "<details><summary>Answer</summary>"
                + f"<p><b>{'<br>'.join(_esc(r) for r in right)}</b></p>"
                + (f"<p>{_esc(q.explanation)}</p>" if q.explanation else "")
                + "</details></div>")
        parts.append("</div>")
        return "\n".join(parts)

    def __repr__(self) -> str:
        return self.text()


class _QuizForm:
    """ipywidgets form; its text/plain form is the quiz's deterministic text."""

    def __init__(self, quiz: Quiz):
        self.quiz = quiz
        self.results: dict[int, bool | None] = {}
        self.box = None
        try:
            import ipywidgets as w
        except ImportError:  # pragma: no cover - ipywidgets is a dependency
            return
        self.score = w.HTML()
        self._update_score()
        self.box = w.VBox([w.HTML(f"<b>Quiz: {_esc(quiz.title)}</b>"), self.score]
                          + [self._row(w, i, q) for i, q in enumerate(quiz.questions, 1)])

    def _row(self, w, number: int, q: Question):
        label = w.HTML(f"<b>{number}.</b> {_esc(q.text().split(chr(10))[0])}")
        feedback = w.HTML()
        get = lambda: field.value  # noqa: E731
        if isinstance(q, SingleChoice):
            field = w.RadioButtons(options=[(f"({c}) {o}", c) for c, o in zip(q.letters, q.options)],
                                   value=None, layout=w.Layout(width="auto"))
        elif isinstance(q, MultiChoice):
            boxes = [w.Checkbox(description=f"({c}) {o}", value=False, indent=False,
                                layout=w.Layout(width="auto")) for c, o in zip(q.letters, q.options)]
            field = w.VBox(boxes)
            get = lambda: [c for c, b in zip(q.letters, boxes) if b.value]  # noqa: E731
        else:
            field = w.Text(placeholder=f"a number{' in ' + q.unit if q.unit else ''}", continuous_update=False)
        button = w.Button(description="Check", button_style="primary")

        def on_click(_):
            fb = q.grade(get())
            color = {True: "green", False: "#b00", None: "#a60"}[fb.correct]
            feedback.value = f"<span style='color:{color}'>{_esc(str(fb))}</span>"
            if fb.correct is not None:
                self.results[number] = fb.correct
            self._update_score()

        button.on_click(on_click)
        if isinstance(field, w.Text):  # Enter (or leaving the box) checks too
            field.observe(on_click, names="value")
        return w.VBox([label, field, w.HBox([button]), feedback],
                      layout=w.Layout(margin="6px 0 6px 0"))

    def _update_score(self):
        right = sum(1 for v in self.results.values() if v)
        self.score.value = (f"Score: {right} / {len(self.quiz)} correct "
                            f"({len(self.results)} answered)")

    def _repr_mimebundle_(self, include=None, exclude=None):
        return widgets.bundle(self.box, self.quiz.text())


def _esc(s: str) -> str:
    """``s`` as HTML text: escaped, `code` in backticks as ``<code>``, stray backticks dropped."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(s)).replace("`", "")
