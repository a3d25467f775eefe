"""Answers as quantities: a number with a unit, read in any spelling, for the exercises' checks.

:func:`parse_quantity` reads ``74.5``, ``"74.5 GiB"`` (unit in any case) or ``(74.5, "GiB")`` in a unit of
:data:`UNITS` (bytes, FLOP, FLOP/s, bytes/s, time, bytes per parameter, plain numbers and percentages); decimal
prefixes are powers of 1000, binary ones of 1024. A comma is read only as a thousands separator, a bool is not a
number, and every refusal is a one-line :class:`~memlab.errors.ConfigError` saying what to write instead.
"""

from __future__ import annotations

import math
import re
from typing import Any

from memlab.errors import ConfigError

ECHO_CHARS = 40
"""An answer echoed in a message is clipped to this many characters."""

# unit -> (dimension, factor to the dimension's base unit). Decimal prefixes are powers of 1000, binary of 1024.
UNITS: dict[str, tuple[str, float]] = {"": ("number", 1.0), "%": ("number", 0.01), "x": ("number", 1.0)}
for _prefix, _factor in {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}.items():
    UNITS[f"{_prefix}B"] = ("bytes", _factor)
    UNITS[f"{_prefix}FLOP"] = ("flop", _factor)
    UNITS[f"{_prefix}FLOP/s"] = ("flop/s", _factor)
    UNITS[f"{_prefix}B/s"] = ("bytes/s", _factor)
for _prefix, _power in {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5}.items():
    UNITS[f"{_prefix}B"] = ("bytes", 1024.0**_power)
    UNITS[f"{_prefix}B/s"] = ("bytes/s", 1024.0**_power)
UNITS.update({"s": ("time", 1.0), "ms": ("time", 1e-3), "us": ("time", 1e-6), "ns": ("time", 1e-9)})
UNITS.update({"B/param": ("bytes/param", 1.0)})
_ALIASES = {"FLOPs": "FLOP", "TFLOPS": "TFLOP/s", "GFLOPS": "GFLOP/s", "PFLOPS": "PFLOP/s", "KB": "kB",
            "µs": "us", "bytes": "B", "bytes/param": "B/param", "B/parameter": "B/param", "percent": "%"}
_BY_LOWER: dict[str, str] = {name.lower(): name for name in UNITS} | {a.lower(): u for a, u in _ALIASES.items()}
"""Any spelling's lower case -> the canonical unit: "gib", "GIB" and "GiB" are one unit (memlab knows no bits)."""

_NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?[\d_,.]*\d[\d_,.]*(?:[eE][-+]?\d+)?)\s*([^\d\s].*?)?\s*$")
PREFIX_RATIOS = tuple(base**k for base in (1000.0, 1024.0) for k in (-3, -2, -1, 1, 2, 3))
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][-+]?\d+)?$")


def clip(value: Any, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (with an ellipsis), for echoing a learner's answer."""
    text = value if isinstance(value, str) else repr(value)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_bool(value: Any) -> bool:
    return type(value).__name__ in {"bool", "bool_"}


def canonical_unit(unit: str) -> str | None:
    """The canonical spelling of ``unit`` in any letter case ("gib" -> "GiB", "tflops" -> "TFLOP/s"), or None."""
    return _BY_LOWER.get(unit.strip().lower()) if isinstance(unit, str) else None


def _example(unit: str) -> str:
    return f"74.5 or '74.5 {unit}'" if unit else "74.5"


def _number(text: str, unit: str) -> tuple[float, int]:
    """A number token read as a float, and its count of significant digits; commas only as thousands groups."""
    cleaned = text.replace("_", "")
    if "," in cleaned:
        if not _THOUSANDS.match(cleaned):
            raise ConfigError(f"{clip(text)} has a comma that is not a thousands separator, so it is ambiguous: for a "
                              f"decimal write a point ({text.replace(',', '.')!r}), for thousands group by three "
                              "digits (1,000).")
        cleaned = cleaned.replace(",", "")
    try:
        number = float(cleaned)
    except ValueError:
        raise ConfigError(f"could not read {clip(text)} as a number; write e.g. {_example(unit)}.") from None
    mantissa = re.split(r"[eE]", cleaned)[0].lstrip("+-").replace(".", "").lstrip("0")
    digits = len(mantissa.rstrip("0")) if "." not in cleaned else len(mantissa)
    return number, max(digits, 1)


def read_answer(answer: Any, unit: str) -> tuple[float, str, int]:
    """(number in the answer's own unit, that unit, significant digits): the parsing under :func:`parse_quantity`."""
    want = canonical_unit(unit)
    if want is None:
        raise ConfigError(f"unknown unit {unit!r}; known: {', '.join(sorted(k for k in UNITS if k))}.")
    if is_bool(answer) or (isinstance(answer, tuple) and answer and is_bool(answer[0])):
        raise ConfigError(f"{clip(answer)} is a truth value, not a number; write the number, e.g. 74.5.")
    if isinstance(answer, tuple) and len(answer) == 2:
        value, given = answer
        if not isinstance(given, str):
            raise ConfigError(f"the unit in {clip(answer)} must be a string such as {unit or '%'!r}.")
    elif isinstance(answer, str):
        match = _NUMBER_WITH_UNIT.match(answer)
        if not match:
            raise ConfigError(f"could not read {clip(answer)} as a number{' with a unit' if want else ''}, e.g. "
                              f"{_example(want)}.")
        value, given = match.group(1), match.group(2) or ""
        given = given if given else want
    else:
        value, given = answer, want
    given_unit = canonical_unit(given)
    if given_unit is None or UNITS[given_unit][0] != UNITS[want][0]:
        if want in {"", "x"} and given_unit not in {"%", "x", ""}:
            raise ConfigError(f"the question asks for a plain number, without a unit: write the number alone (not "
                              f"{clip(answer)}).")
        if given_unit is None:
            raise ConfigError(f"unknown unit {clip(given)} in the answer; give the value in {want}.")
        raise ConfigError(f"the answer is in {given_unit} ({UNITS[given_unit][0]}), the question asks for "
                          f"{UNITS[want][0]} in {want}.")
    if isinstance(value, str):
        number, digits = _number(value, want)
    else:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"could not read {clip(value)} as a number; write e.g. {_example(want)}.") from None
        if not math.isfinite(number):
            raise ConfigError(f"the answer {clip(answer)} is not a finite number.")
        digits = _number(f"{number:.15g}", want)[1]
    if not math.isfinite(number):
        raise ConfigError(f"the answer {clip(answer)} is not a finite number.")
    return number, given_unit, digits


def parse_quantity(answer: Any, unit: str) -> float:
    """An answer in ``unit``: a number (taken in ``unit``), ``"74.5 GiB"`` (unit in any case), or ``(74.5, "GiB")``.

    Raises :class:`ConfigError` when the answer is not a number (a bool is not), its unit measures something else,
    or a comma could be a decimal comma (``"1,2 GB"``: 1.2 or 12? write a point; ``"1,000 MB"`` is thousands).
    """
    number, given, _ = read_answer(answer, unit)
    return number * UNITS[given][1] / UNITS[canonical_unit(unit)][1]
