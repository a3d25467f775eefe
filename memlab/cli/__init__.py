"""The ``memlab`` command: ``estimate``, ``trace``, ``mfu``, ``gpus``, ``oom``, ``report``, ``measure``, ``ledger``,
``shard``.

Human tables by default (GiB = 2**30 bytes and GB = 10**9 bytes, both labelled), ``--json`` for machines. Bad
input of any kind (unknown names, bad numbers, conflicting options) prints ONE line ``memlab: error: ...`` on
stderr and exits with status 2, never a traceback: an unknown flag names the closest flag of that subcommand
(:data:`SYNONYMS` for other tools' spellings, then difflib), an invalid choice names the option that takes the value,
and an OSError while writing (a full disk, stdout to ``/dev/full``, stdout closed) is that one line too. Each
subcommand is a module of this package with ``add_arguments(parser)`` and ``run(args)``; the shared options are
declared once in :mod:`memlab.cli.args` (``--model SPEC`` names a model as :func:`memlab.predict.families.resolve`
does); ``hf_source`` reads ``--hf PATH`` (a config.json, its folder, a shipped name, a model id in the local Hugging
Face cache) and says which family, traits and source of truth an answer used; ``traced``
prints a trace's table for ``trace`` and for ``estimate --hf`` when the formula does not cover a config;
``device_view`` prints the ``--gpu`` verdict on device-used (allocated, reserved, nvidia-smi) for both.

Subcommands are data: :data:`COMMANDS` holds ``Command(name, help, add_arguments, run)`` entries; add one to
extend the tool. A ``passthrough`` command gets its remaining arguments unparsed (``args.rest``) and parses them
itself, as ``report`` does with :func:`memlab.course.report.main`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memlab.cli import estimate, gpus, measure, mfu, oom, report, shard, trace
from memlab.cli.args import check_model_spec
from memlab.errors import MemlabError
from memlab.predict.spec.validate import canonical_choice
from memlab.predict.spec.versions import UnverifiedVersionWarning


class _UsageError(Exception):
    """An argparse error, turned into one stderr line by :func:`main`."""


SYNONYMS: dict[str, tuple[str, ...]] = {
    "--batch-size": ("--batch", "--global-batch"), "--micro-batch-size": ("--batch",), "--bs": ("--batch",),
    "--global-batch-size": ("--global-batch",), "--seq-len": ("--seq",), "--seq-length": ("--seq",),
    "--sequence-length": ("--seq",), "--context-length": ("--seq", "--max-seq"), "--max-seq-len": ("--max-seq",),
    "--max-position-embeddings": ("--max-seq",), "--model": ("--preset",), "--model-name": ("--preset",),
    "--dtype": ("--precision", "--weights", "--dtype"), "--optim": ("--optimizer",), "--zero-stage": ("--zero",),
    "--gpus": ("--num-gpus", "--world-size"), "--n-gpus": ("--num-gpus", "--world-size"),
    "--num-devices": ("--num-gpus", "--world-size"), "--dp": ("--world-size",), "--hidden-size": ("--d-model",),
    "--num-layers": ("--n-layers",), "--num-heads": ("--n-heads",), "--num-attention-heads": ("--n-heads",),
    "--vocab-size": ("--vocab",), "--tokens-per-sec": ("--tokens-per-second",), "--tps": ("--tokens-per-second",),
    "--throughput": ("--tokens-per-second",), "--gradient-checkpointing": ("--recompute",),
    "--activation-checkpointing": ("--recompute",), "--tensor-parallel": ("--tp",), "--tp-size": ("--tp",),
    "--output": ("--out",), "-o": ("--out",), "--gpu-name": ("--gpu",), "--accelerator": ("--gpu",),
}
"""Flags other tools use, mapped to memlab's (those the subcommand has are suggested)."""


def closest_flag(flag: str, options: list[str]) -> str | None:
    """The option(s) of ``options`` a mistyped or foreign ``flag`` most likely means (synonyms, then difflib)."""
    import difflib

    name = flag.split("=", 1)[0]
    known = [c for c in SYNONYMS.get(name.lower(), ()) if c in options]
    if known:
        return " or ".join(known)
    hits = difflib.get_close_matches(name, [o for o in options if o.startswith("--")], n=1, cutoff=0.6)
    return hits[0] if hits else None


def _choice_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """For 'argument --x: invalid choice: V', the other options of ``parser`` that accept V."""
    match = re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: '([^']*)'", message)
    if not match:
        return ""
    flag, value = match.groups()
    others = [a.option_strings[0] for a in parser._actions
              if a.choices is not None and flag not in a.option_strings and value in map(str, a.choices)]
    return f"; {value!r} is a value of {' and '.join(others)} (did you mean {others[0]} {value}?)" if others else ""


class _Parser(argparse.ArgumentParser):
    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        # A choice is read as the API reads one (memlab.predict.spec.validate.canonical_choice): '--precision BF16' and
        # '--attention " flash"' name bf16 and flash, as Setup(precision="BF16") does; the run prints the canonical
        # name. The subcommand names are not choices of this kind.
        if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
            arg_string = canonical_choice(arg_string, action.choices)
        return super()._get_value(action, arg_string)

    def error(self, message: str) -> Any:  # argparse would print the usage and exit; we want one line
        if message.startswith("unrecognized arguments: "):
            options = [s for a in self._actions for s in a.option_strings]
            flags = [w for w in message.removeprefix("unrecognized arguments: ").split() if w.startswith("-")]
            hints = [f"{f} (did you mean {c}?)" if (c := closest_flag(f, options)) else f + self._elsewhere(f)
                     for f in flags]
            message = f"unrecognized argument(s): {', '.join(hints) or message}"
        raise _UsageError(f"{message}{_choice_hint(self, message)} (see '{self.prog} --help')")

    def _elsewhere(self, flag: str) -> str:
        """' (an option of estimate, not of measure)' when another subcommand has ``flag``."""
        siblings: dict[str, argparse.ArgumentParser] = getattr(self, "siblings", {})
        name = flag.split("=", 1)[0]
        owners = [c for c, p in siblings.items() if p is not self and any(name in a.option_strings for a in p._actions)]
        return f" (an option of {' and '.join(owners)}, not of {self.prog.split()[-1]})" if owners else ""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        # Unknown flags are reported by the subcommand's parser, which knows the options to suggest from.
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = getattr(ns, "_parser", self)
            sub.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns


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
    Command("trace", "trace one training step on fake tensors: bytes per phase, the peak, top modules",
            trace.add_arguments, trace.run),
    Command("mfu", "model FLOPs utilisation of a measured throughput", mfu.add_arguments, mfu.run),
    Command("gpus", "list the accelerator table", gpus.add_arguments, gpus.run),
    Command("oom", "decode an out-of-memory message (argument, --file LOG or stdin): its kind, what to try, "
                   "its fields", oom.add_arguments, oom.run),
    Command("report", "build the course report (arguments go to memlab.course.report)", report.add_arguments,
            report.run, passthrough=True),
    Command("measure", "run the reference model and print predicted vs measured bytes", measure.add_arguments,
            measure.run),
    Command("ledger", "measure the validation grid and print the estimator's achieved errors",
            measure.add_ledger_arguments, measure.run_ledger),
    Command("shard", "launch torchrun ranks (DDP, ZeRO-1, FSDP2) and print per-rank bytes and bytes moved",
            shard.add_arguments, shard.run),
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
        p.set_defaults(_run=cmd.run, _parser=p)
        p.siblings = sub.choices  # type: ignore[attr-defined]  # for "an option of estimate, not of measure"
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``memlab`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status (2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if sys.stdout is None:  # started with stdout closed (`memlab gpus >&-`): every print() would vanish silently
        return _fail("cannot write standard output: it is closed; redirect it to a file or /dev/null")
    parser = build_parser()
    try:
        passthrough = {c.name: c for c in COMMANDS if c.passthrough}
        if argv and argv[0] in passthrough:  # its own parser handles everything after the name, --help included
            return passthrough[argv[0]].run(argparse.Namespace(rest=argv[1:]))
        args = parser.parse_args(argv)
        check_model_spec(args)
        if args.command is None:
            names = ", ".join(c.name for c in COMMANDS)
            raise _UsageError(f"give a command: {names} (see 'memlab --help')")
        with warnings.catch_warnings():  # a command that answers from the formula says this in its own line
            warnings.filterwarnings("ignore", category=UnverifiedVersionWarning)
            code = args._run(args)
        sys.stdout.flush()  # a full disk or /dev/full fails here, inside the one-line error handling
        return code
    except (MemlabError, _UsageError) as exc:
        return _fail(str(exc))
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:  # Ctrl-C: one line; a sweep's finished rows are already on disk
        print("memlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly (Python docs, "Note on SIGPIPE")
        _silence_stdout()
        return 1
    except OSError as exc:  # writing stdout or a file failed (disk full, permissions): one line, no traceback
        _silence_stdout()
        where = f" {exc.filename!r}" if exc.filename else " standard output"
        return _fail(f"cannot write{where}: {exc.strerror or exc}")


def _fail(message: str) -> int:
    text = " ".join(message.split())
    print(f"memlab: error: {text[:2000]}", file=sys.stderr)
    return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush of unwritable output cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real file (captured in tests)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
