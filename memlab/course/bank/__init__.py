"""The course's exercises, one module per chapter, and the one call a notebook makes.

``ch00`` (your machine), ``ch01`` (an OOM), ``ch02`` (bytes per parameter), ``ch03`` (mixed precision), ``ch04``
(activations and checkpointing), ``ch05`` (data parallelism: DDP, ZeRO, FSDP), ``ch06`` (model parallelism:
TP, SP, PP, CP, EP), ``ch07`` (FlashAttention), ``ch08`` (roofline and MFU), ``ch09`` (nvidia-smi), ``ch10``
(inference), ``ch11`` (your model), ``ch12`` (fine-tune on your card).

A chapter module defines ``EXERCISES``, a tuple of :class:`~memlab.course.exercises.Numeric` and
:class:`~memlab.course.exercises.Choice`, each named ``"NN.short-name"`` (NN: the chapter). The notebook's cell is::

    answer = ...
    check("02.mistral7b-states", answer)

with the chapter's knobs or measured data passed as keyword arguments when the reference needs them
(``check("04.sequential-2", answer, measured=strategies)``). See :mod:`memlab.course.exercises` for the fields and
a complete example. Names are unique across the course: a duplicate is an authoring error, raised at load.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from memlab.course.exercises import Exercise, Result
from memlab.errors import UnknownNameError, closest_names

CHAPTER_MODULES = tuple(f"ch{n:02d}" for n in range(13))
"""The bank modules, in course order; a new chapter adds its module here."""


@cache
def exercises() -> dict[str, Exercise]:
    """Every exercise of the course by name, in chapter order (each bank module imported once)."""
    found: dict[str, Exercise] = {}
    for module in CHAPTER_MODULES:
        chapter = module[2:]
        for exercise in importlib.import_module(f"{__name__}.{module}").EXERCISES:
            if not exercise.name.startswith(f"{chapter}."):
                raise UnknownNameError(f"exercise {exercise.name!r} in bank/{module}.py must be named "
                                       f"'{chapter}.<short-name>'.")
            if exercise.name in found:
                raise UnknownNameError(f"exercise {exercise.name!r} is defined twice.")
            found[exercise.name] = exercise
    return found


def get(name: str) -> Exercise:
    """The exercise called ``name`` (e.g. ``"02.amp-states"``); an unknown name lists the closest ones."""
    bank = exercises()
    if name not in bank:
        close = closest_names(name, list(bank))
        raise UnknownNameError(f"no exercise {name!r}; closest: {', '.join(close) or 'none'}.")
    return bank[name]


def check(name: str, answer: Any, **data: Any) -> Result:
    """Check ``answer`` to the exercise ``name``; ``data`` are the arguments its reference needs."""
    return get(name).check(answer, **data)


def chapter_exercises(chapter: str) -> list[Exercise]:
    """The exercises of chapter ``chapter`` ("02"), in order."""
    return [ex for name, ex in exercises().items() if name.startswith(f"{chapter}.")]
