"""The one exception family memlab raises for bad input.

Every public entry point validates at the boundary and raises a subclass of :class:`MemlabError` whose
message says what was wrong and what to do. The command line turns these into one line on stderr and exit
status 2; notebooks show the message, never a deep traceback into torch.
"""

from __future__ import annotations


class MemlabError(ValueError):
    """Bad input to memlab: the message names the field and the fix."""


class ConfigError(MemlabError):
    """A model configuration that cannot describe a real transformer."""


class SetupError(MemlabError):
    """A training or inference setup that is inconsistent or unsupported."""


class UnknownNameError(MemlabError, KeyError):
    """A preset, GPU or policy name that memlab does not know; the message lists the closest names."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


def closest_names(name: str, known: list[str] | tuple[str, ...], n: int = 4) -> list[str]:
    """Up to ``n`` known names closest to ``name`` (difflib ratio, then substring matches); ``name`` may be any
    value (``None``, a number): it is compared as its ``str``."""
    import difflib

    key = str(name).strip().lower()
    hits = difflib.get_close_matches(key, [k.lower() for k in known], n=n, cutoff=0.4)
    by_lower = {k.lower(): k for k in known}
    out = [by_lower[h] for h in hits]
    for k in known:
        if len(out) >= n:
            break
        if k not in out and (key in k.lower() or k.lower() in key):
            out.append(k)
    return out


def unknown_name(kind: str, name: str, known: list[str] | tuple[str, ...]) -> UnknownNameError:
    """Build the standard 'unknown X' error with the closest known names."""
    near = closest_names(name, known)
    hint = f" Closest: {', '.join(near)}." if near else ""
    return UnknownNameError(f"unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(known))}.")


class LaunchError(MemlabError):
    """A multi-process launch (torchrun) that failed or timed out; the message carries the failing rank's log."""
