"""``memlab report ...``: builds the course report; every argument goes to :func:`memlab.course.report.main`."""

from __future__ import annotations

import argparse

from memlab.errors import MemlabError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """None: the report parses its own arguments (``memlab report --help``)."""


def run(args: argparse.Namespace) -> int:
    """``memlab report ...``: hands its arguments to :func:`memlab.course.report.main`."""
    try:
        from memlab.course import report
    except ImportError as exc:
        raise MemlabError(f"'memlab report' is unavailable: memlab.course.report cannot be imported ({exc})") from None
    return int(report.main(list(args.rest)) or 0)
