"""The library versions memlab's family terms were verified against, and the guard that says so when others run.

The formula of a Hugging Face family (:mod:`memlab.predict.families.reader`, one module per family in
:mod:`memlab.predict.families`) counts what transformers' modelling code, torch's kernels and autograd, and peft's
adapters save: it is exact for the code it was checked against and may be silently off for another release
(transformers 5.25 rewrote Falcon's attention).
:data:`VERIFIED` is that record, in one place: the versions ``requirements.lock`` installs, which ``make test``
checks byte for byte and ``make upgrade-check`` re-checks against the newest releases
(``scripts/upgrade_check.py``). A test keeps it equal to the lock.

:func:`unverified` names the installed libraries that differ, read from the installed distributions' metadata
(``importlib.metadata``: nothing is imported); ``memlab estimate --hf`` answers from the trace of the installed code
when it is not empty, and :func:`warn_if_unverified` is the one line the Python API gives.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings

VERIFIED: dict[str, str] = {
    "torch": "2.13.0",
    "transformers": "5.25.0",
    "peft": "0.21.2",
    "bitsandbytes": "0.50.2",
    "accelerate": "1.16.0",
    "deepspeed": "0.19.8",
}
"""Library -> the release memlab's byte-exact tests passed with (``make test`` under ``requirements.lock``).
torch is compared without its local build tag (``2.13.0+cpu`` and ``2.13.0+cu130`` are one release)."""

GUARDED = ("transformers", "torch", "peft")
"""The libraries whose code a Hugging Face family's formula counts (the modelling files, the kernels and autograd,
the adapters): a different release of one of them makes the formula's number unverified."""


GUARD_PREFIX = "memlab's family terms were not verified against"
"""How the guard's line starts: ``make upgrade-check`` builds the chapters under releases that are unverified by
definition, and filters this one expected line out of the pages it scans (``PYTHONWARNINGS=ignore:PREFIX``)."""


class UnverifiedVersionWarning(UserWarning):
    """A formula answer computed under a library release memlab's family terms were not verified against."""


def installed(name: str) -> str | None:
    """The installed release of distribution ``name`` (its local build tag dropped), or None when absent."""
    try:
        return importlib.metadata.version(name).split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def unverified(names: tuple[str, ...] = GUARDED) -> tuple[str, ...]:
    """One phrase per library of ``names`` that is installed at another release than :data:`VERIFIED`
    (``"transformers 5.26.0 (verified: 5.25.0)"``); empty when every one is the verified release or absent.
    Cached: call ``unverified.cache_clear()`` after changing what is installed (the tests fake a version so)."""
    out = []
    for name in names:
        have = installed(name)
        if have is not None and have != VERIFIED[name]:
            out.append(f"{name} {have} (verified: {VERIFIED[name]})")
    return tuple(out)


def unverified_line(names: tuple[str, ...] = GUARDED) -> str | None:
    """The one line that says a formula's number is unverified here, or None when every library is verified."""
    found = unverified(names)
    if not found:
        return None
    return (f"{GUARD_PREFIX} {', '.join(found)}: the formula may be off for this code; the trace of the installed "
            "code is exact for it (memlab trace --hf, or memlab estimate --hf, which answers from it)")


def warn_if_unverified(names: tuple[str, ...] = GUARDED) -> None:
    """Warn once per call site (:class:`UnverifiedVersionWarning`, one line) when :func:`unverified_line` has one."""
    line = unverified_line(names)
    if line is not None:
        warnings.warn(UnverifiedVersionWarning(line), stacklevel=3)
