"""Progress lines and a time bound for a trace: :class:`Progress` and :func:`time_bound`.

A fake-tensor trace runs the model's real Python code twice (two steps). For most decoder families that is a few
seconds at any size, but a modelling file that loops over the tokens in Python runs that loop once per token per
layer: transformers' Mamba on CPU (``modeling_mamba.py``, the recurrent iteration of the scan when no CUDA kernel
is available) traced a 24-layer, 1024-token config for over 12 minutes with no output. So a trace can report each
phase and each block's forward (:class:`Progress`, lines to stderr) and stop after a bound with one clear line
(:func:`time_bound`, raising :class:`TraceTimeout`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from torch import nn

from memlab.errors import MemlabError


class TraceTimeout(MemlabError):
    """The trace ran past its time bound (one line: where it was, and what to change)."""


class Progress:
    """Writes ``trace: <what> (<seconds> s)`` lines to ``stream`` (stderr) once the blocks are watched
    (:meth:`watch_blocks`: the model is built) and the trace has run ``after`` seconds, so a quick trace, or a bad
    config refused while it is read or built, prints none (its error stays one line); :attr:`last` is the latest
    step, printed or not."""

    def __init__(self, stream: TextIO | None = None, *, after: float = 2.0, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.after = after
        self.quiet = quiet
        self.start = time.monotonic()
        self.last = "starting"
        self.live = False

    def __call__(self, what: str) -> None:
        self.last = what
        elapsed = time.monotonic() - self.start
        if self.live and not self.quiet and elapsed >= self.after:
            print(f"trace: {what} ({elapsed:.1f} s)", file=self.stream, flush=True)

    def watch_blocks(self, model: nn.Module) -> None:
        """A forward pre-hook on each block of ``model`` (the longest ``nn.ModuleList``) that reports
        ``forward: block i/N``. The hooks allocate nothing, so the traced bytes are unchanged."""
        self.live = True
        blocks = max((m for m in model.modules() if isinstance(m, nn.ModuleList)), key=len, default=None)
        if not blocks:
            return
        n = len(blocks)
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(_reporter(self, f"forward: block {i + 1}/{n}"))
        blocks[-1].register_forward_hook(_reporter(self, f"forward: block {n}/{n} done; backward and optimizer "
                                                         "step"))


def _reporter(progress: Progress, text: str) -> Callable[..., None]:
    def hook(*_: object) -> None:
        progress(text)

    return hook


@contextlib.contextmanager
def time_bound(seconds: float | None, where: Callable[[], str], hint: str = "") -> Iterator[None]:
    """Raise :class:`TraceTimeout` when the body runs past ``seconds`` (None or 0: no bound). Uses ``SIGALRM``, so
    it bounds only in the main thread of a POSIX process (elsewhere the body runs unbounded). ``where()`` says how
    far it got; ``hint`` what to change."""
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def stop(*_: object) -> None:
        raise TraceTimeout(f"the trace ran past its time bound of {seconds:g} s (last: {where()})"
                           + (f": {hint}" if hint else ""))

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
