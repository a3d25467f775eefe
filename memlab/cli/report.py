"""``memlab report ...``: builds the course report; every argument goes to :func:`memlab.course.report.main`.

Before handing over, ``--device`` goes through the one device resolver and ``--out`` is checked as a writable
folder, so a bad value is the one-line error before any chapter runs; an OSError while building becomes one too.
"""

from __future__ import annotations

import argparse

from memlab.cli.args import device_arg, output_dir
from memlab.errors import MemlabError

_CHECKS = {"--device": device_arg, "--out": output_dir}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """None: the report parses its own arguments (``memlab report --help``)."""


def check_rest(rest: list[str]) -> None:
    """Validate ``--device`` and ``--out`` among the report's arguments (``--flag V`` or ``--flag=V``)."""
    for i, word in enumerate(rest):
        flag, eq, value = word.partition("=")
        if flag not in _CHECKS:
            continue
        if not eq:
            if i + 1 >= len(rest):
                continue  # the report's own parser says the value is missing
            value = rest[i + 1]
        try:
            _CHECKS[flag](value)
        except argparse.ArgumentTypeError as exc:
            raise MemlabError(f"argument {flag}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """``memlab report ...``: hands its arguments to :func:`memlab.course.report.main`."""
    rest = list(args.rest)
    if "-h" not in rest and "--help" not in rest:
        check_rest(rest)
    try:
        from memlab.course import report
    except ImportError as exc:
        raise MemlabError(f"'memlab report' is unavailable: memlab.course.report cannot be imported ({exc})") from None
    try:
        return int(report.main(rest, prog="memlab report") or 0)
    except OSError as exc:
        where = f" {exc.filename!r}" if exc.filename else ""
        raise MemlabError(f"the report could not be written{where}: {exc.strerror or exc}") from None
