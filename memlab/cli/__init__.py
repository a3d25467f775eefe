"""The ``memlab`` command: ``estimate``, ``mfu``, ``gpus``, ``report``, ``measure``, ``ledger``.

Human tables by default (GiB = 2**30 bytes and GB = 10**9 bytes, both labelled), ``--json`` for machines. Bad
input of any kind (unknown names, bad numbers, conflicting options) prints ONE line ``memlab: error: ...`` on
stderr and exits with status 2, never a traceback. Each subcommand is a module of this package with
``add_arguments(parser)`` and ``run(args)``; the shared options are declared once in :mod:`memlab.cli.args`.

Subcommands are data: :data:`COMMANDS` holds ``Command(name, help, add_arguments, run)`` entries; add one to
extend the tool. A ``passthrough`` command gets its remaining arguments unparsed (``args.rest``) and parses them
itself, as ``report`` does with :func:`memlab.course.report.main`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memlab.cli import estimate, gpus, measure, mfu, report
from memlab.errors import MemlabError


class _UsageError(Exception):
    """An argparse error, turned into one stderr line by :func:`main`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print the usage and exit; we want one line
        raise _UsageError(f"{message} (see '{self.prog} --help')")


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_arguments(parser)`` declares its options, ``run(args) -> exit status`` does the work."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    passthrough: bool = False
    """Hand every remaining argument (``args.rest``) to ``run`` unparsed."""


COMMANDS: tuple[Command, ...] = (
    Command("estimate", "predict memory per device (training or inference) and check the fit",
            estimate.add_arguments, estimate.run),
    Command("mfu", "model FLOPs utilisation of a measured throughput", mfu.add_arguments, mfu.run),
    Command("gpus", "list the accelerator table", gpus.add_arguments, gpus.run),
    Command("report", "build the course report (arguments go to memlab.course.report)", report.add_arguments,
            report.run, passthrough=True),
    Command("measure", "run the reference model and print predicted vs measured bytes", measure.add_arguments,
            measure.run),
    Command("ledger", "measure the validation grid and print the estimator's achieved errors",
            measure.add_ledger_arguments, measure.run_ledger),
)
"""The subcommands, in help order. Add a :class:`Command` here to extend ``memlab``."""


def build_parser(commands: tuple[Command, ...] = COMMANDS) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = _Parser(prog="memlab", description="Predict and measure accelerator memory and compute.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for cmd in commands:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, add_help=not cmd.passthrough)
        cmd.add_arguments(p)
        if cmd.passthrough:
            p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``memlab`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status (2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        passthrough = {c.name: c for c in COMMANDS if c.passthrough}
        if argv and argv[0] in passthrough:  # its own parser handles everything after the name, --help included
            return passthrough[argv[0]].run(argparse.Namespace(rest=argv[1:]))
        args = parser.parse_args(argv)
        if args.command is None:
            names = ", ".join(c.name for c in COMMANDS)
            raise _UsageError(f"give a command: {names} (see 'memlab --help')")
        return args._run(args)
    except (MemlabError, _UsageError) as exc:
        print(f"memlab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly (Python docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
