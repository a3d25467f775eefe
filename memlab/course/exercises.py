"""Exercises that check themselves: the learner answers in a cell, memlab says correct, or how far off and a hint.

Reference answers are computed by memlab when the check runs (a callable such as
``lambda: estimate.training(cfg, setup).optimizer_bytes``), never typed into the notebook, so they stay right
when a formula or a table row is corrected. An answer left as ``...`` or ``None`` is "not answered yet": the check
shows the hint and does not raise, so ``make report`` can execute every chapter with its exercises open.

Solutions are hidden unless ``MEMLAB_SOLUTIONS`` is set to ``1`` (``python -m memlab.course.report --solutions`` does
that for the kernels it starts) or ``solutions=True`` is passed; only then does a result carry the expected value.

>>> ex = Numeric("gib", "An 80 GB card in GiB?", reference=lambda: 80e9 / 2**30, hint="1 GiB = 2**30 B",
...              unit="GiB", rtol=0.01)
>>> ex.check("74.5 GiB").status
'correct'
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from memlab.errors import ConfigError

Status = Literal["correct", "incorrect", "unanswered", "invalid"]

SOLUTIONS_ENV = "MEMLAB_SOLUTIONS"

# unit -> (dimension, factor to the dimension's base unit). Decimal prefixes are powers of 1000, binary of 1024.
_UNITS: dict[str, tuple[str, float]] = {"": ("number", 1.0), "%": ("number", 0.01), "x": ("number", 1.0)}
for _prefix, _factor in {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}.items():
    _UNITS[f"{_prefix}B"] = ("bytes", _factor)
    _UNITS[f"{_prefix}FLOP"] = ("flop", _factor)
    _UNITS[f"{_prefix}FLOP/s"] = ("flop/s", _factor)
    _UNITS[f"{_prefix}B/s"] = ("bytes/s", _factor)
for _prefix, _power in {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5}.items():
    _UNITS[f"{_prefix}B"] = ("bytes", 1024.0**_power)
    _UNITS[f"{_prefix}B/s"] = ("bytes/s", 1024.0**_power)
_UNITS.update({"s": ("time", 1.0), "ms": ("time", 1e-3), "us": ("time", 1e-6), "ns": ("time", 1e-9)})
_UNITS.update({"FLOPs": _UNITS["FLOP"], "TFLOPS": _UNITS["TFLOP/s"], "GFLOPS": _UNITS["GFLOP/s"]})

_NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?(?:\d[\d_,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*$")


def solutions_enabled(solutions: bool | None = None) -> bool:
    """An explicit ``solutions`` wins; otherwise ``MEMLAB_SOLUTIONS`` in (1, true, yes) turns solutions on."""
    if solutions is not None:
        return bool(solutions)
    return os.environ.get(SOLUTIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _unanswered(answer: Any) -> bool:
    return answer is None or answer is Ellipsis or (isinstance(answer, str) and answer.strip() in {"", "..."})


def parse_quantity(answer: Any, unit: str) -> float:
    """An answer in ``unit``: a number (taken in ``unit``), ``"74.5 GiB"``, or ``(74.5, "GiB")``.

    Raises :class:`ConfigError` when the answer is not a number or its unit measures something else.
    """
    if unit not in _UNITS:
        raise ConfigError(f"unknown unit {unit!r}; known: {', '.join(sorted(k for k in _UNITS if k))}.")
    if isinstance(answer, tuple) and len(answer) == 2:
        value, given = answer
    elif isinstance(answer, str):
        match = _NUMBER_WITH_UNIT.match(answer)
        if not match:
            raise ConfigError(f"could not read {answer!r} as a number with a unit, e.g. '74.5 {unit}'.")
        value, given = match.group(1).replace("_", "").replace(",", ""), match.group(2) or unit
    else:
        value, given = answer, unit
    if given not in _UNITS:
        raise ConfigError(f"unknown unit {given!r} in the answer; give the value in {unit}.")
    if _UNITS[given][0] != _UNITS[unit][0]:
        raise ConfigError(f"the answer is in {given} ({_UNITS[given][0]}), the question asks for {_UNITS[unit][0]}"
                          f" in {unit}.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"could not read {value!r} as a number; write e.g. 74.5 or '74.5 {unit}'.") from None
    if not math.isfinite(number):
        raise ConfigError(f"the answer {answer!r} is not a finite number.")
    return number * _UNITS[given][1] / _UNITS[unit][1]


@dataclass(frozen=True)
class Result:
    """The outcome of one check. ``expected`` is None unless solutions are shown."""

    exercise: str
    status: Status
    message: str
    answer: Any
    expected: Any = None
    unit: str = ""

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.exercise}] {self.status}: {self.message}"

    def _repr_html_(self) -> str:
        colour = {"correct": "#1a7f37", "incorrect": "#b3261e", "unanswered": "#8a6d00", "invalid": "#b3261e"}
        mark = {"correct": "✔", "incorrect": "✘", "unanswered": "…", "invalid": "✘"}[self.status]
        return (f'<div class="memlab-exercise" data-status="{self.status}" style="border-left:4px solid '
                f'{colour[self.status]};padding:4px 10px">{mark} <b>{html.escape(self.exercise)}:</b> '
                f"{html.escape(self.message)}</div>")


@dataclass(frozen=True)
class _Exercise:
    name: str
    question: str
    reference: Callable[[], Any]
    hint: str

    def __post_init__(self) -> None:
        if not callable(self.reference):
            raise ConfigError(f"exercise {self.name!r}: reference must be a callable that computes the answer "
                              "with memlab (e.g. lambda: ...), not a typed-in value.")

    def expected(self) -> Any:
        """The reference answer, computed now."""
        return self.reference()

    def _result(self, status: Status, message: str, answer: Any, solutions: bool | None, unit: str = "") -> Result:
        shown = solutions_enabled(solutions)
        expected = self.expected() if shown else None
        if shown and status != "correct":
            message = f"{message} Solution: {self._format(expected)}."
        return Result(self.name, status, message, answer, expected, unit)

    def _format(self, value: Any) -> str:
        return str(value)

    def solution(self, solutions: bool | None = None) -> str:
        """The worked answer when solutions are shown, otherwise a line saying how an instructor renders them."""
        if not solutions_enabled(solutions):
            return ("Solutions are hidden (an instructor renders them with "
                    "`python -m memlab.course.report --solutions`).")
        return f"{self.name}: {self._format(self.expected())}"


@dataclass(frozen=True)
class Numeric(_Exercise):
    """A number (with a unit) checked against a computed reference within a relative tolerance ``rtol``."""

    unit: str = ""
    rtol: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.unit not in _UNITS:
            raise ConfigError(f"exercise {self.name!r}: unknown unit {self.unit!r}.")
        if not 0 < self.rtol < 1:
            raise ConfigError(f"exercise {self.name!r}: rtol must be a fraction in (0, 1), got {self.rtol!r}.")

    def _format(self, value: Any) -> str:
        number = float(value)
        text = f"{number:,.0f}" if abs(number) >= 1e4 and number == round(number) else f"{number:.4g}"
        return f"{text} {self.unit}".strip()

    def check(self, answer: Any, solutions: bool | None = None) -> Result:
        """Compare ``answer`` with the reference; never raises for a learner's answer."""
        if _unanswered(answer):
            return self._result("unanswered", f"Not answered yet. Hint: {self.hint}", answer, solutions, self.unit)
        try:
            value = parse_quantity(answer, self.unit)
        except ConfigError as err:
            return self._result("invalid", f"{err} Hint: {self.hint}", answer, solutions, self.unit)
        expected = float(self.expected())
        if math.isclose(value, expected, rel_tol=self.rtol, abs_tol=0.0 if expected else 1e-12):
            return self._result("correct", f"Correct: {self._format(value)} is within {self.rtol:.0%}.", answer,
                                solutions, self.unit)
        return self._result("incorrect", self._how_far(value, expected), answer, solutions, self.unit)

    def _how_far(self, value: float, expected: float) -> str:
        if expected == 0:
            return f"Not yet: the answer should be zero. Hint: {self.hint}"
        ratio = value / expected
        if 0.5 <= ratio <= 2:
            off = f"{abs(ratio - 1):.1%} too {'high' if ratio > 1 else 'low'}"
        else:
            off = f"off by a factor of {ratio:.3g}"
        extra = ""
        if self.unit.endswith(("B", "B/s")) and any(math.isclose(ratio, (1.024**k) ** s, rel_tol=self.rtol / 2)
                                                    for k in (1, 2, 3, 4) for s in (1, -1)):
            extra = " That ratio is a power of 1.024: check GB (10^9 B) against GiB (2^30 B)."
        elif any(math.isclose(ratio, 10.0**k, rel_tol=self.rtol) for k in (-9, -6, -3, 3, 6, 9)):
            extra = f" That is off by a power of 1000: check the unit ({self.unit})."
        return f"Not yet: {self._format(value)} is {off} (tolerance {self.rtol:.0%}).{extra} Hint: {self.hint}"


@dataclass(frozen=True)
class Choice(_Exercise):
    """One option out of ``options`` (key -> text); the reference callable returns the right key."""

    options: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.options or len(self.options) < 2:
            raise ConfigError(f"exercise {self.name!r}: a choice needs at least two options.")

    def _format(self, value: Any) -> str:
        return f"{value} ({self.options[value]})" if value in self.options else str(value)

    def _key(self, answer: Any) -> str | None:
        text = str(answer).strip().lower()
        for key, option in self.options.items():
            if text in {str(key).lower(), option.strip().lower()}:
                return key
        return None

    def check(self, answer: Any, solutions: bool | None = None) -> Result:
        """Compare the chosen key (or option text, case-insensitive) with the reference key."""
        if _unanswered(answer):
            return self._result("unanswered", f"Not answered yet. Hint: {self.hint}", answer, solutions)
        key = self._key(answer)
        if key is None:
            known = ", ".join(repr(k) for k in self.options)
            return self._result("invalid", f"{answer!r} is not one of the options {known}.", answer, solutions)
        expected = self.expected()
        if expected not in self.options:
            raise ConfigError(f"exercise {self.name!r}: the reference returned {expected!r}, not an option key.")
        if key == expected:
            return self._result("correct", f"Correct: {self._format(key)}.", answer, solutions)
        return self._result("incorrect", f"Not yet: {key!r} is not it. Hint: {self.hint}", answer, solutions)
