"""Exercises that check themselves, with their answers kept out of the learner's cell.

An exercise lives in the package, in its chapter's bank (:mod:`memlab.course.bank`, one module per chapter:
``bank/ch02.py`` defines chapter 02's exercises). It holds the question, a **reference** (a callable that computes
the answer with memlab when the check runs, never a typed-in value), a **hint** (shown only after a wrong try), the
**diagnoses** of likely wrong answers, a **why** (shown with a correct answer and in the solution) and, for a
:class:`Choice`, the options and the key. The notebook cell holds only the answer slot and one check call::

    answer = ...
    check("02.mistral7b-states", answer)

A reference that needs the chapter's knobs or measured data takes them as keyword arguments, and the check call
passes them (``check("04.saved-bytes", answer, table=df)``); the reference never reads a notebook global. A
diagnosis keyed by a callable gets the same arguments. ``sample`` (a callable with no argument that returns such
arguments) lets the tests grade every exercise without running its chapter.

What a check says:

- ``...`` or ``None``: "not answered yet", and the form of the answer (its unit, or the option keys). No hint.
- a correct answer: why, and the exact value.
- a wrong answer: how far off, then the matching diagnosis (a named wrong answer, or a slip memlab recognises:
  GB for GiB, a power of 1000, a fraction for a percentage) or, when none matches, the hint.
- an answer that cannot be read (a unit of another dimension, a stray comma): what to write instead;
- data the reference reads is missing (the chapter's measurement did not run): "cannot be checked here".

In a notebook the result renders as HTML with a collapsed ``<details class="memlab-solution">`` block holding the
exact value and why (``<details class="memlab-solution" open>`` when ``MEMLAB_SOLUTIONS=1``, which
``python -m memlab.course.report --solutions`` sets). Its plain text (a terminal, ``text/plain``) never holds the
solution of an exercise not yet answered correctly.

One complete example, as a chapter's bank module (``memlab/course/bank/ch12.py``, listed in
``bank.CHAPTER_MODULES``) defines it; the question's text is the notebook's markdown cell above the check::

    from memlab.course.exercises import Numeric, When
    from memlab.units import GiB


    def _states_gib(model, setup):
        from memlab.predict.estimate import estimate

        return estimate(model, setup).model_state_bytes() / GiB


    def _sample():
        from memlab.predict.spec.model import preset
        from memlab.predict.spec.setup import Setup

        return {"model": preset("tiny-gpt"), "setup": Setup(seq=64, precision="mixed-bf16")}


    EXERCISES = (
        Numeric(
            "12.states-gib", "Model states of this run, GiB",
            reference=_states_gib, unit="GiB", rtol=0.02,
            hint="16 B/param for mixed-bf16 + AdamW: weights, gradients, master copy, two moments",
            why=lambda model, setup: f"16 B × {model.param_count():,} parameters",
            diagnoses={lambda model: 12 * model.param_count() / GiB: "12 B/param leaves out the fp32 master copy.",
                       When(lambda v: v > 1e6): "That looks like bytes; the question asks for GiB."},
            sample=_sample,
        ),
    )

and in the notebook: ``answer = ...`` then ``check("12.states-gib", answer, model=model, setup=setup)``.
"""

from __future__ import annotations

import html
import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from memlab.course.quantities import (
    PREFIX_RATIOS,
    UNITS,
    canonical_unit,
    clip,
    is_bool,
    read_answer,
)
from memlab.course.quantities import parse_quantity as parse_quantity  # the exercises' parser, public here too
from memlab.errors import ConfigError, MemlabError
from memlab.predict.spec.validate import StrictInit

Status = Literal["correct", "incorrect", "unanswered", "invalid", "unavailable"]

SOLUTIONS_ENV = "MEMLAB_SOLUTIONS"
"""Set to 1 (``python -m memlab.course.report --solutions`` does) to open every exercise's solution block."""
FORM_EXAMPLE = 2.5
"""The example number an unanswered numeric check shows, the same for every exercise (review: an example
chosen away from the answer told the learner its magnitude)."""


def solutions_enabled(solutions: bool | None = None) -> bool:
    """An explicit ``solutions`` wins; otherwise ``MEMLAB_SOLUTIONS`` in (1, true, yes) turns solutions on."""
    if solutions is not None:
        return bool(solutions)
    return os.environ.get(SOLUTIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


REVEALS_TAG = "reveals-{name}"
"""The notebook tag of the cell that measures a predict-first exercise's answer (``reveals-00.gemv-intensity``);
myst-nb renders it as the cell's class ``tag_reveals-00.gemv-intensity``."""


def _unanswered(answer: Any) -> bool:
    return answer is None or answer is Ellipsis or (isinstance(answer, str) and answer.strip() in {"", "..."})


@dataclass(frozen=True)
class Result:
    """The outcome of one check.

    ``message`` is what the learner reads; it never holds the solution unless the answer is correct. ``solution``
    is the exact value and why, shown in the notebook's collapsed ``memlab-solution`` block (open when
    ``solutions_open``); ``expected`` is the exact value when solutions are shown, otherwise None.
    """

    exercise: str
    status: Status
    message: str
    answer: Any
    expected: Any = None
    unit: str = ""
    solution: str = ""
    solutions_open: bool = False
    predict_first: bool = False
    """The exercise asks for a prediction that a later cell measures (:attr:`_Exercise.predict_first`)."""

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.exercise}] {self.status}: {self.message}"

    def __repr__(self) -> str:  # text/plain: the feedback without the solution block
        return str(self)

    def _repr_html_(self) -> str:
        colour = {"correct": "#1a7f37", "incorrect": "#b3261e", "unanswered": "#8a6d00", "invalid": "#b3261e",
                  "unavailable": "#6e7781"}
        mark = {"correct": "✔", "incorrect": "✘", "unanswered": "…", "invalid": "✘", "unavailable": "–"}[self.status]
        details = ""
        if self.solution:
            opened = " open" if self.solutions_open else ""
            details = (f'<details class="memlab-solution"{opened}><summary>Solution</summary>'
                       f"<p>{html.escape(self.solution)}</p></details>")
        marks = f' data-exercise="{html.escape(self.exercise)}"' + (' data-predict-first="true"' * self.predict_first)
        return (f'<div class="memlab-exercise" data-status="{self.status}"{marks} style="border-left:4px solid '
                f'{colour[self.status]};padding:4px 10px">{mark} <b>{html.escape(self.exercise)}:</b> '
                f"{html.escape(self.message)}{details}</div>")


@dataclass(frozen=True)
class When:
    """A diagnosis key that matches a learner's value by a predicate, e.g. ``When(lambda v: v < 12)``: ``v`` is the
    answer in the exercise's unit. (A bare callable key computes a wrong answer from the check's arguments.)"""

    predicate: Callable[[float], bool]

    def __post_init__(self) -> None:
        if not callable(self.predicate):
            raise ConfigError(f"When(...) takes a predicate of the learner's value, got {clip(self.predicate)}.")


def _parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``fn``'s parameters that the check's keyword arguments fill."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _call(fn: Callable[..., Any], data: Mapping[str, Any]) -> Any:
    """``fn`` called with the check's arguments it names (all of them when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return fn(**data)
    return fn(**{name: data[name] for name in _parameters(fn) if name in data})


@dataclass(frozen=True)
class _Exercise(StrictInit):
    _error = ConfigError  # an unknown or missing field (StrictInit): the author's slip, named

    name: str
    question: str
    reference: Callable[..., Any]
    hint: str
    why: str | Callable[..., str] = ""
    """Why the answer is what it is: shown with a correct answer and in the solution. A callable gets the check's
    arguments (for a sentence whose numbers are computed)."""
    sample: Callable[[], Mapping[str, Any]] | None = None
    """Example arguments for the reference (built without running the chapter), for the tests."""
    predict_first: bool = False
    """The question asks for a prediction that a cell of the chapter then measures. Its check renders with
    ``data-predict-first``, and the measuring cell carries the notebook tag ``reveals-NAME``
    (:data:`REVEALS_TAG`): the book's browser test checks that no such cell comes above the check."""

    def __post_init__(self) -> None:
        for text in ("name", "question", "hint"):
            if not isinstance(getattr(self, text), str):
                raise ConfigError(f"exercise {clip(self.name)}: {text} must be a string, got "
                                  f"{clip(getattr(self, text))} ({type(getattr(self, text)).__name__}).")
        if not callable(self.reference):
            raise ConfigError(f"exercise {self.name!r}: reference must be a callable that computes the answer "
                              "with memlab (e.g. lambda: ...), not a typed-in value.")
        if not (isinstance(self.why, str) or callable(self.why)):
            raise ConfigError(f"exercise {self.name!r}: why must be a string or a callable, got {clip(self.why)}.")
        if self.sample is not None and not callable(self.sample):
            raise ConfigError(f"exercise {self.name!r}: sample must be a callable returning the check's arguments.")

    @property
    def needs(self) -> tuple[str, ...]:
        """The keyword arguments the check call must pass (the reference's required parameters)."""
        try:
            params = inspect.signature(self.reference).parameters.values()
        except (TypeError, ValueError):
            return ()
        return tuple(p.name for p in params if p.default is p.empty
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def _data(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        missing = [name for name in self.needs if name not in data]
        if missing:
            raise ConfigError(f"exercise {self.name!r} needs {', '.join(f'{m}=...' for m in missing)} in its check "
                              f"call, e.g. check({self.name!r}, answer, {', '.join(f'{m}={m}' for m in missing)}).")
        return data

    def expected(self, **data: Any) -> Any:
        """The reference answer, computed now from the check's arguments."""
        return _call(self.reference, self._data(data))

    def explanation(self, **data: Any) -> str:
        """The ``why`` sentence, computed from the check's arguments when it is a callable."""
        return str(_call(self.why, data) if callable(self.why) else self.why).strip()

    def solution_text(self, **data: Any) -> str:
        """The exact value and why, as the notebook's solution block shows it."""
        return self._solution(self.expected(**data), data)

    def _solution(self, expected: Any, data: Mapping[str, Any]) -> str:
        why = self.explanation(**data)
        return f"{self._format(expected)}." + (f" Why: {why}" if why else "")

    def _reference_or_none(self, data: Mapping[str, Any]) -> tuple[Any, str | None]:
        """The reference computed from ``data``, or None and why it could not be (a measurement that did not run
        here: a table without the row the exercise needs)."""
        try:
            return self.expected(**data), None
        except MemlabError:  # the exercise's own bug (a NaN, a setup memlab refuses): its author's to fix
            raise
        except Exception as err:  # the data a chapter measured may lack what this exercise reads
            return None, f"{type(err).__name__}: {clip(str(err), 120)}"

    def _unavailable(self, answer: Any, reason: str) -> Result:
        return Result(self.name, "unavailable", f"This exercise cannot be checked here: the data it reads is "
                      f"missing ({reason}); it needs the chapter's measurement above.", answer,
                      predict_first=self.predict_first)

    def _result(self, status: Status, message: str, answer: Any, solutions: bool | None, data: Mapping[str, Any],
                expected: Any, unit: str = "") -> Result:
        shown = solutions_enabled(solutions)
        return Result(self.name, status, message, answer, expected if shown else None, unit,
                      self._solution(expected, data), shown, self.predict_first)

    def _format(self, value: Any) -> str:
        return str(value)

    def _correct(self, shown: str, data: Mapping[str, Any], expected: Any, within: str = "") -> str:
        why = self.explanation(**data)
        exact = self._format(expected)
        return f"Correct: {shown}{within}; the exact value is {exact}." + (f" Why: {why}" if why else "")

    def solution(self, solutions: bool | None = None, **data: Any) -> str:
        """The worked answer when solutions are shown, otherwise a line saying how an instructor renders them."""
        if not solutions_enabled(solutions):
            return ("Solutions are hidden (an instructor renders them with "
                    "`python -m memlab.course.report --solutions`).")
        return f"{self.name}: {self.solution_text(**data)}"


Diagnoses = Mapping[Any, str]
"""Likely wrong answers and what to say about them. A key is one of: a number (a wrong answer in the exercise's
unit, e.g. the seed's ``12`` B/param), a callable that computes such a number from the check's arguments when the
check runs (``lambda: 7e9``: the nominal size; ``lambda model: 12 * model.param_count()``), or :class:`When` with a
predicate of the learner's value in the exercise's unit (``When(lambda v: v < 1)``). A number matches within the
exercise's ``rtol``."""


def _percent(fraction: float) -> str:
    """A tolerance as a percentage with the digits it needs: 0.01 -> "1%", 1e-4 -> "0.01%"."""
    return f"{100 * fraction:.2g}%"


def _rounded(value: float, digits: int) -> float:
    return float(f"{value:.{max(digits, 1)}g}")


@dataclass(frozen=True)
class Numeric(_Exercise):
    """A number (with a unit) checked against a computed reference within a relative tolerance ``rtol``.

    ``diagnoses`` names likely wrong answers (see :data:`Diagnoses`): a wrong answer that matches one gets its
    message. Without one, the check recognises three slips (a fraction given for a percentage or the reverse, a
    factor of 1.024^k: GB for GiB, a factor of 1000^k: a prefix) and otherwise gives the hint. A right value rounded
    to two or three significant digits, too coarse for the tolerance, is told so.
    """

    unit: str = ""
    rtol: float = 0.02
    diagnoses: Diagnoses | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        canonical = canonical_unit(self.unit)
        if canonical is None:
            raise ConfigError(f"exercise {self.name!r}: unknown unit {self.unit!r}; known: "
                              f"{', '.join(sorted(k for k in UNITS if k))}.")
        object.__setattr__(self, "unit", canonical)
        if is_bool(self.rtol) or not isinstance(self.rtol, (int, float)) or not 0 < self.rtol < 1:
            raise ConfigError(f"exercise {self.name!r}: rtol must be a fraction in (0, 1), got {self.rtol!r}.")
        if self.diagnoses is not None:
            if not isinstance(self.diagnoses, Mapping):
                raise ConfigError(f"exercise {self.name!r}: diagnoses must map a wrong answer (a number, a "
                                  f"callable or When) to a message, got {type(self.diagnoses).__name__}.")
            for key, message in self.diagnoses.items():
                numeric = isinstance(key, (int, float)) and not is_bool(key) and math.isfinite(key)
                if not (numeric or callable(key) or isinstance(key, When)) or not isinstance(message, str) \
                        or not message.strip():
                    raise ConfigError(f"exercise {self.name!r}: diagnosis {key!r}: the key must be a number, a "
                                      "callable or When(...) and the message a non-empty string.")

    def expected(self, **data: Any) -> float:
        """The reference answer, computed now, as a finite float. A reference that returns anything else (None,
        NaN, a string, a bool) is the exercise author's bug: a :class:`ConfigError` naming the exercise, never a
        TypeError, and never a learner graded against NaN."""
        value = super().expected(**data)
        number = None
        if not isinstance(value, str | bytes) and not is_bool(value):  # a 0-d tensor or numpy scalar converts
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                number = None
        if number is None or not math.isfinite(number):
            raise ConfigError(f"exercise {self.name!r}: its reference returned {clip(value)} "
                              f"({type(value).__name__}), not a finite number: the exercise's reference is broken, "
                              "not the answer.")
        return number

    def _format(self, value: Any) -> str:
        number = float(value)  # 4 significant digits, or whole numbers with separators between 10^4 and 10^15
        grouped = 1e4 <= abs(number) < 1e15
        text = f"{number:,.{0 if number == round(number) else 1}f}" if grouped else f"{number:.4g}"
        return {"%": f"{text} %", "x": f"{text}×"}.get(self.unit, f"{text} {self.unit}".strip())

    def form(self, expected: float | None = None) -> str:
        """What form the answer takes, for an unanswered check. The example is the same for every exercise
        (:data:`FORM_EXAMPLE`), so it says nothing about ``expected`` (an example chosen away from the answer would
        tell its magnitude); ``expected`` is accepted for callers and ignored."""
        example = FORM_EXAMPLE
        if self.unit in {"", "x"}:
            return f"a plain number (e.g. {example:g})"
        return f"a number in {self.unit} (e.g. {example:g} or '{example:g} {self.unit}')"

    def check(self, answer: Any, solutions: bool | None = None, **data: Any) -> Result:
        """Compare ``answer`` with the reference computed from ``data``; never raises for a learner's answer."""
        self._data(data)
        expected, missing = self._reference_or_none(data)
        if missing:
            return self._unavailable(answer, missing)
        if _unanswered(answer):
            return self._result("unanswered", f"Not answered yet: replace ... with {self.form(expected)}, then run the "
                                "cell.", answer, solutions, data, expected, self.unit)
        try:
            number, given, digits = read_answer(answer, self.unit)
        except ConfigError as err:
            return self._result("invalid", str(err), answer, solutions, data, expected, self.unit)
        value = number * UNITS[given][1] / UNITS[self.unit][1]
        if math.isclose(value, expected, rel_tol=self.rtol, abs_tol=0.0 if expected else 1e-12):
            message = self._correct(self._format(value), data, expected, f" (within {_percent(self.rtol)})")
            return self._result("correct", message, answer, solutions, data, expected, self.unit)
        expected_given = expected * UNITS[self.unit][1] / UNITS[given][1]
        rough = 2 <= digits <= 3 and math.isclose(_rounded(expected_given, digits), number, rel_tol=1e-9)
        return self._result("incorrect", self._how_far(value, expected, rough, digits, data), answer, solutions,
                            data, expected, self.unit)

    def _diagnosis(self, value: float, data: Mapping[str, Any]) -> str | None:
        for key, message in (self.diagnoses or {}).items():
            try:
                if isinstance(key, When):
                    hit = bool(key.predicate(value))
                else:
                    wrong = float(_call(key, data) if callable(key) else key)
                    hit = math.isclose(value, wrong, rel_tol=self.rtol, abs_tol=0.0 if wrong else 1e-12)
            except Exception:  # a diagnosis that cannot judge this answer says nothing
                hit = False
            if hit:
                return message.strip()
        return None

    def _how_far(self, value: float, expected: float, rough: bool, digits: int, data: Mapping[str, Any]) -> str:
        if expected == 0:
            return f"Not yet: the answer should be zero. Hint: {self.hint}"
        ratio = value / expected
        if 0.5 <= ratio <= 2:
            off = f"{abs(ratio - 1):.1%} too {'high' if ratio > 1 else 'low'}"
        else:
            off = f"off by a factor of {ratio:.3g}"
        head = f"Not yet: {self._format(value)} is {off} (tolerance {_percent(self.rtol)})."
        if rough:
            return (f"{head} It is the right value rounded to {digits} significant digits, which is coarser than "
                    "the tolerance: give one more digit.")
        diagnosis = self._diagnosis(value, data)
        if diagnosis:
            return f"{head} {diagnosis}"
        if self.unit == "%" and math.isclose(ratio, 0.01, rel_tol=self.rtol):
            return (f"{head} That looks like a fraction: the question asks for a percentage "
                    f"({value:.4g} as a fraction is {100 * value:.4g} %).")
        if self.unit == "" and math.isclose(ratio, 100.0, rel_tol=self.rtol):
            return (f"{head} That looks like a percentage: the question asks for a fraction "
                    f"({value:.4g} % = {value / 100:.4g}).")
        if self.unit.endswith(("B", "B/s")) and any(math.isclose(ratio, (1.024**k) ** s, rel_tol=self.rtol / 2)
                                                    for k in (1, 2, 3, 4) for s in (1, -1)):
            return f"{head} That ratio is a power of 1.024: check GB (10^9 B) against GiB (2^30 B)."
        if any(math.isclose(ratio, prefix, rel_tol=self.rtol) for prefix in PREFIX_RATIOS):
            return (f"{head} That is off by a power of 1000 (or 1024): check the prefix of the unit "
                    f"({self.unit or 'a plain number'}).")
        return f"{head} Hint: {self.hint}"


@dataclass(frozen=True)
class Choice(_Exercise):
    """One option out of ``options`` (key -> text); the reference callable returns the right key (or its text)."""

    options: Mapping[str, str] | None = None
    diagnoses: Mapping[str, str] | None = None
    """A wrong option's key -> what that choice likely misreads (shown when it is chosen)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.options, Mapping) or len(self.options) < 2:
            raise ConfigError(f"exercise {self.name!r}: a choice needs at least two options.")
        if self.diagnoses is not None and not isinstance(self.diagnoses, Mapping):
            raise ConfigError(f"exercise {self.name!r}: diagnoses must map an option key to a message, got "
                              f"{clip(self.diagnoses)}.")
        stray = set(self.diagnoses or {}) - set(self.options)
        if stray:
            raise ConfigError(f"exercise {self.name!r}: diagnoses for {sorted(map(str, stray))}, which are not "
                              "option keys.")

    def expected(self, **data: Any) -> str:
        """The right option's key, computed now (a reference may return the key or the option's text)."""
        value = super().expected(**data)
        key = self._key(value)
        if key is None:
            raise ConfigError(f"exercise {self.name!r}: the reference returned {value!r}, not an option key.")
        return key

    def _format(self, value: Any) -> str:
        if value not in self.options:
            return str(value)
        text = self.options[value]
        return repr(value) if text.strip().lower() == str(value).lower() else f"{value!r} ({text})"

    def form(self) -> str:
        """The option keys and what each means, for an unanswered check."""
        return "; ".join(f"{key!r}: {text}" for key, text in self.options.items())

    def _correct(self, shown: str, data: Mapping[str, Any], expected: Any, within: str = "") -> str:
        why = self.explanation(**data)
        return f"Correct: {shown}." + (f" Why: {why}" if why else "")

    def _key(self, answer: Any) -> str | None:
        text = str(answer).strip().lower()
        for key, option in self.options.items():
            if text in {str(key).lower(), option.strip().lower()}:
                return key
        return None

    def check(self, answer: Any, solutions: bool | None = None, **data: Any) -> Result:
        """Compare the chosen key (or option text, case-insensitive) with the reference key."""
        self._data(data)
        expected, missing = self._reference_or_none(data)
        if missing:
            return self._unavailable(answer, missing)
        if _unanswered(answer):
            return self._result("unanswered", f"Not answered yet: replace ... with one option's key, then run the "
                                f"cell. Options: {self.form()}.", answer, solutions, data, expected)
        key = self._key(answer)
        if key is None:
            known = ", ".join(repr(k) for k in self.options)
            return self._result("invalid", f"{clip(answer)} is not one of the options {known}.", answer, solutions,
                                data, expected)
        if key == expected:
            return self._result("correct", self._correct(self._format(key), data, expected), answer, solutions,
                                data, expected)
        diagnosis = (self.diagnoses or {}).get(key)
        said = f" {diagnosis.strip()}" if diagnosis else f" Hint: {self.hint}"
        return self._result("incorrect", f"Not yet: {key!r} is not it.{said}", answer, solutions, data, expected)


Exercise = Numeric | Choice
