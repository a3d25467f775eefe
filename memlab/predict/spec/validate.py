"""Type and range checks for memlab's public inputs, driven by dataclass field annotations. No torch, no numpy.

:func:`check_fields` validates every field of a frozen dataclass from its type hint and ``field(metadata=...)``:

- ``int``: a whole number, not a bool (``True`` is not 1 layer) and not a float (``1.0`` is not a ZeRO stage);
  ``metadata["min"]`` (default 1, or 0 when the field's default is 0) and ``metadata["max"]``;
- ``float``: a finite real number, not a bool and not a string (``'0.5'`` would multiply into a string);
  ``min`` (default 0), ``min_open`` (``True``: the minimum itself is excluded), ``max``, ``max_open`` (likewise);
- ``bool``: exactly ``True`` or ``False`` (``'no'`` is truthy and would silently mean yes);
- ``str``: a string, within ``metadata["choices"]`` when given;
- ``Literal[...]``: one of the values, with the value's own type (``True == 1`` but is no ZeRO stage);
- a string choice (``Literal`` or ``choices``) is read as every name memlab takes (presets, GPUs, devices,
  precision policies): case and surrounding whitespace do not matter, and the field is stored in its canonical
  spelling (``Setup(precision="FP32 ").precision == "fp32"``) by :func:`canonical_choice`;
- ``X | None``: None, or a valid X. Other annotations (mappings, nested dataclasses) are left to the class.

``metadata["why"]`` is the reason for ``max`` and is part of the message, so a limit is always explained. The
shared limits (batch, seq, parameters, steps, ...) are one public table, :data:`LIMITS`, read by the dataclasses,
the estimator, the FLOP counter, the runner and the command line alike. The same
metadata bounds the ``memlab`` command's options (:mod:`memlab.cli.args`), so the API and the CLI agree. A field
added to a dataclass later is validated by its annotation without new code.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from memlab.errors import MemlabError, closest_names


@dataclasses.dataclass(frozen=True)
class Limit:
    """The largest value memlab accepts for one kind of input and the reason it is safe: ``why`` is part of every
    message that refuses a larger value, so a limit is always explained. The bounds sit orders of magnitude above
    any published model or cluster; they exist to turn typos (an extra three zeros) into a clear error."""

    max: int | float
    why: str

    def meta(self, **extra: Any) -> dict[str, Any]:
        """This limit as dataclass field metadata (``max`` and ``why``, plus ``extra``) for :func:`check_fields`
        and the command line's option bounds."""
        return {"max": self.max, "why": self.why, **extra}


LIMITS: Mapping[str, Limit] = types.MappingProxyType({
    "batch": Limit(10**7, "ten million sequences per rank, about 1000x the largest published global batches; beyond "
                          "it byte counts leave the range a float64 sweep holds exactly"),
    "seq": Limit(10**8, "100 million tokens, 10x the longest published context (10M tokens recalled [gemini2024])"),
    "ranks": Limit(10**6, "a million data-parallel ranks, about 10x the largest training clusters built"),
    "tp": Limit(10**4, "ten thousand tensor-parallel ranks; tensor parallelism is used within a node or a few "
                       "(2-64 ranks)"),
    "steps": Limit(10**4, "ten thousand timed steps (or decoded tokens) per measurement; a median over more adds no "
                          "precision to a memory experiment"),
    "grad_accum": Limit(10**6, "micro-steps per optimizer step"),
    "pp": Limit(10**4, "ten thousand pipeline stages, 10x the deepest published model's blocks per stage of one"),
    "cp": Limit(10**6, "a million context-parallel ranks, one token each of a million-token sequence"),
    "params": Limit(10**15, "a quadrillion parameters, about 500x the largest published models (~2 trillion)"),
    "layers": Limit(10**4, "ten thousand blocks, 10x the deepest published transformer (DeepNet, 1,000 layers "
                           "[wang2022]); parameter shapes are listed per layer, so this also keeps every call well "
                           "under a second"),
    "d_model": Limit(10**6, "a million, about 40x the widest published models (d_model 12,288-25,600)"),
    "d_ff": Limit(10**7, "ten million, about 100x the widest published MLPs"),
    "vocab": Limit(10**8, "a hundred million tokens, about 400x the largest published vocabularies (~256k)"),
    "tokens_per_s": Limit(1e13, "ten trillion tokens/s, about 1000x what a 100,000-GPU cluster processes"),
    "devices": Limit(10**7, "ten million devices, about 100x the largest clusters built"),
    "overhead_bytes": Limit(2**50, "one pebibyte (2**50 bytes), over 1000x any accelerator's memory"),
    "peak_flops": Limit(1e17, "100 PFLOP/s per device, over 10x the largest dense figure any vendor prints; a larger "
                              "value is a unit mistake (FLOP/s, not TFLOP/s) or a corrupt measurement"),
})
"""memlab's input limits by name (read-only): ``LIMITS["seq"].max`` and ``LIMITS["seq"].why``."""


def show(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a multi-GB string is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def check_int(name: str, value: object, *, lo: int = 1, hi: int | None = None, why: str = "", owner: str = "",
              err: type[MemlabError] = MemlabError) -> int:
    """``value`` as an int in [lo, hi]; bools, floats and strings raise ``err`` naming the field and the fix."""
    what = _where(owner, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "a bool" if isinstance(value, bool) else type(value).__name__
        raise err(f"{what} must be a whole number (int) >= {lo}, got {show(value)} ({kind}): pass e.g. {max(lo, 1)}")
    value = int(value)
    if value < lo:
        raise err(f"{what} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise err(f"{what} must be <= {hi:,}, got {show(value)}" + (f": {why}" if why else ""))
    return value


def check_number(name: str, value: object, *, lo: float = 0.0, hi: float | None = None, lo_open: bool = False,
                 hi_open: bool = False, why: str = "", owner: str = "", err: type[MemlabError] = MemlabError) -> float:
    """``value`` as a finite float in the range; bools and strings raise ``err`` (``'0.5'`` is not 0.5)."""
    what = _where(owner, name)
    if lo == 0 and lo_open:
        rng = "a positive number" + ("" if hi is None else f" {'below' if hi_open else 'at most'} {hi:g}")
    elif hi is None:
        rng = f"a number {'>' if lo_open else '>='} {lo:g}"
    else:
        rng = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise err(f"{what} must be {rng}, got {show(value)} ({type(value).__name__}): pass a float")
    try:
        x = float(value)
    except OverflowError:  # an int beyond float's range (10**400)
        x = math.inf
    if not math.isfinite(x):
        raise err(f"{what} must be finite, {rng}, got {show(value)}")
    low_bad = x <= lo if lo_open else x < lo
    high_bad = hi is not None and (x >= hi if hi_open else x > hi)
    if low_bad or high_bad:
        raise err(f"{what} must be {rng}, got {show(value)}" + (f": {why}" if why and high_bad else ""))
    return x


def check_bool(name: str, value: object, *, owner: str = "", err: type[MemlabError] = MemlabError) -> bool:
    """``value`` if it is exactly True or False (``'no'``, ``0`` and ``None`` are refused)."""
    if not isinstance(value, bool):
        raise err(f"{_where(owner, name)} must be True or False, got {show(value)} ({type(value).__name__})")
    return value


def check_str(name: str, value: object, *, choices: tuple[Any, ...] | None = None, owner: str = "",
              err: type[MemlabError] = MemlabError) -> str:
    """``value`` if it is a string (and one of ``choices`` when given)."""
    what = _where(owner, name)
    if not isinstance(value, str):
        hint = f" one of {', '.join(map(repr, choices))}" if choices else " a string"
        raise err(f"{what} must be{hint}, got {show(value)} ({type(value).__name__})")
    if choices is not None and value not in choices:
        near = closest_names(value, [str(c) for c in choices])
        hint = f" (closest: {', '.join(near)})" if near else ""
        raise err(f"{what} must be one of {', '.join(map(repr, choices))}, got {show(value)}{hint}")
    return value


def canonical_choice(value: Any, choices: Iterable[Any]) -> Any:
    """The choice a string ``value`` names, read case- and whitespace-insensitively (``"FP32 "`` -> ``"fp32"``,
    ``" Flash"`` -> ``"flash"``): the one rule for every choice memlab reads (dataclass fields, dtype and
    recompute arguments, the command line's options). Anything else, or a string that names no choice, is returned
    unchanged for the caller's check to refuse with the closest names."""
    if not isinstance(value, str):
        return value
    key = value.strip().lower()
    return next((c for c in choices if isinstance(c, str) and c.lower() == key), value)


def check_choice(name: str, value: object, choices: tuple[Any, ...], *, owner: str = "",
                 err: type[MemlabError] = MemlabError) -> Any:
    """``value`` if it equals one of ``choices`` AND has that choice's type (``True`` is not ``1``)."""
    if not any(type(value) is type(c) and value == c for c in choices):
        raise err(f"{_where(owner, name)} must be one of {', '.join(map(repr, choices))}, got {show(value)}"
                  + (f" ({type(value).__name__})" if any(value == c for c in choices) else ""))
    return value


@dataclasses.dataclass(frozen=True)
class FieldRule:
    """How one dataclass field is checked: ``kind`` is int, float, bool, str, literal or other."""

    name: str
    kind: str
    optional: bool
    choices: tuple[Any, ...] | None
    lo: float | None
    hi: float | None
    hi_open: bool
    why: str
    lo_open: bool = False


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(the hint without ``| None``, whether None is allowed)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


@functools.cache
def field_rules(cls: type) -> tuple[FieldRule, ...]:
    """The checks :func:`check_fields` runs on ``cls``, read once from its annotations and field metadata."""
    hints = typing.get_type_hints(cls)
    rules = []
    for f in dataclasses.fields(cls):
        hint, optional = _unwrap(hints[f.name])
        choices = f.metadata.get("choices")
        if typing.get_origin(hint) is typing.Literal:
            kind, choices = "literal", typing.get_args(hint)
        else:
            kind = {int: "int", float: "float", bool: "bool", str: "str"}.get(hint, "other")
        default_lo = 0 if f.default == 0 and not isinstance(f.default, bool) else (1 if kind == "int" else 0.0)
        rules.append(FieldRule(f.name, kind, optional, tuple(choices) if choices is not None else None,
                               f.metadata.get("min", default_lo), f.metadata.get("max"),
                               bool(f.metadata.get("max_open", False)), f.metadata.get("why", ""),
                               bool(f.metadata.get("min_open", False))))
    return tuple(rules)


def check_fields(obj: Any, err: type[MemlabError] = MemlabError, *, skip: tuple[str, ...] = ()) -> None:
    """Check every field of the dataclass instance ``obj`` by its annotation (see the module docstring). A string
    choice is first stored in its canonical spelling (:func:`canonical_choice`), also for the fields in ``skip``
    (they are checked by the class, against the canonical name)."""
    owner = type(obj).__name__
    for r in field_rules(type(obj)):
        value = getattr(obj, r.name)
        if r.choices is not None and isinstance(value, str):
            canonical = canonical_choice(value, r.choices)
            if canonical != value:
                object.__setattr__(obj, r.name, canonical)  # frozen dataclasses: during __post_init__ only
                value = canonical
        if r.name in skip or (r.optional and value is None):
            continue
        if r.kind == "int":
            check_int(r.name, value, lo=int(r.lo or 0), hi=None if r.hi is None else int(r.hi), why=r.why,
                      owner=owner, err=err)
        elif r.kind == "float":
            check_number(r.name, value, lo=float(r.lo or 0.0), hi=r.hi, lo_open=r.lo_open, hi_open=r.hi_open, why=r.why,
                         owner=owner, err=err)
        elif r.kind == "bool":
            check_bool(r.name, value, owner=owner, err=err)
        elif r.kind == "str":
            check_str(r.name, value, choices=r.choices, owner=owner, err=err)
        elif r.kind == "literal":
            check_choice(r.name, value, r.choices or (), owner=owner, err=err)


class _StrictCall(type):
    """Metaclass of :class:`StrictInit`: checks the arguments of ``Cls(...)`` (not of copy/pickle, which call
    ``__new__`` directly) before the dataclass ``__init__`` would raise a TypeError."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        err: type[MemlabError] = getattr(cls, "_error", MemlabError)
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = [f.name for f in fields]
        for key in kwargs:
            if key not in names:
                near = closest_names(key, names, n=2)
                hint = f" (did you mean {' or '.join(near)}?)" if near else ""
                raise err(f"{cls.__name__} has no field {show(key)}{hint}; its fields: {', '.join(names)}")
        if args and all(f.kw_only for f in fields):
            raise err(f"{cls.__name__} takes keyword arguments only, e.g. {cls.__name__}({names[0]}=...)")
        if len(args) > len(names):
            raise err(f"{cls.__name__} takes at most {len(names)} arguments, got {len(args)}")
        given = set(names[: len(args)]) | set(kwargs)
        missing = [f.name for f in fields if f.name not in given and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise err(f"{cls.__name__} needs {', '.join(missing)}: pass {missing[0]}=...")
        return super().__call__(*args, **kwargs)


class StrictInit(metaclass=_StrictCall):
    """Base for frozen dataclasses: an unknown, missing or positional argument is a :class:`MemlabError` naming the
    field (and the closest one), not Python's TypeError. A class attribute ``_error`` picks the subclass raised."""

    __slots__ = ()
