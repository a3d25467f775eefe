"""``memlab oom``: decode an out-of-memory message: its kind, what to try, and each field it states.

With a model (``--preset``, dimensions or ``--hf``), its setup options and ``--gpu``, the levers of ``memlab
estimate --levers`` that make the step fit follow the decoding (:func:`memlab.cli.estimate.lever_answers`).
The message comes as an argument (quote it), from a log file (``--file``: the last OOM message in it) or from
stdin (``-``). It is read by :func:`memlab.measure.oom.parse_oom_message` (every shape torch has printed), judged by
:func:`memlab.labs.oom.oom_kind` (too big, full, fragmentation candidate: arithmetic on the message's own fields)
and decoded field by field by :func:`memlab.measure.oom.decode_oom`, as chapter 01 does. Text holding no OOM
message is one error line, never a guess.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from memlab.cli.args import print_json
from memlab.errors import ConfigError

OOM_LINE = re.compile(r"out of memory|DefaultCPUAllocator|Tried to allocate", re.I)
"""A line that starts (or holds) an out-of-memory message, in any shape :mod:`memlab.measure.oom` reads."""
MESSAGE_LINES = 12
"""At most this many lines, from the OOM line to the next blank one, are the message (a terminal wraps it)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The message (or ``--file``), and optionally the model and setup that ran out of memory with ``--gpu``: then
    the levers of ``memlab estimate --levers`` that make it fit are printed after the decoding."""
    from memlab.cli.args import add_model_arguments, add_setup_arguments, bounded_int, gpu_name
    from memlab.cli.hf_source import hf_path
    from memlab.predict.spec.validate import LIMITS

    p.add_argument("message", nargs="?", default=None,
                   help="the OOM message (quoted), or - to read it from stdin")
    p.add_argument("--file", type=Path, default=None, metavar="LOG",
                   help="a log file: its last out-of-memory message is decoded")
    p.add_argument("--json", action="store_true", help="print JSON")
    g = p.add_argument_group("the step that ran out of memory (optional): the levers that make it fit")
    g.add_argument("--hf", type=hf_path, metavar="PATH", help="the model from a Hugging Face config (as estimate)")
    g.add_argument("--gpu", type=gpu_name, metavar="NAME", help="the card it ran on (see 'memlab gpus')")
    g.add_argument("--lever-ranks", type=bounded_int(2, LIMITS["ranks"].max, LIMITS["ranks"].why), default=8,
                   metavar="N", help="ranks the ZeRO-3 lever shards over (default 8)")
    add_model_arguments(p)
    add_setup_arguments(p)


def last_message(text: str) -> str:
    """The last out-of-memory message in ``text`` (a pasted message or a whole log): from the last line that
    starts one to the next blank line. ConfigError when there is none."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if OOM_LINE.search(line)]
    if not hits:
        raise ConfigError("no out-of-memory message in the input: paste the whole message, from 'CUDA out of "
                          "memory. Tried to allocate ...' (or 'DefaultCPUAllocator: ...') to its end")
    start = hits[-1]
    while start > 0 and hits.count(start - 1):  # a message wrapped over several matching lines: its first one
        start -= 1
    end = start + 1
    while end < len(lines) and end - start < MESSAGE_LINES and lines[end].strip():
        end += 1
    return "\n".join(lines[start:end])


def _source(args: argparse.Namespace) -> str:
    if args.file is not None and args.message is not None:
        raise ConfigError("give the message or --file LOG, not both")
    if args.file is not None:
        try:
            return args.file.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise ConfigError(f"cannot read {args.file}: {err.strerror or err}") from None
    if args.message is None or args.message == "-":
        if args.message is None and sys.stdin.isatty():
            raise ConfigError("give the OOM message (quoted), --file LOG, or - to read stdin")
        return sys.stdin.read()
    return args.message


def decoded(text: str) -> dict[str, Any]:
    """The kind of the last OOM message in ``text``, why, and its fields (bytes, GiB, meaning, for the fix)."""
    from memlab.labs.oom import oom_kind
    from memlab.measure.oom import decode_oom, parse_oom_message

    info = parse_oom_message(last_message(text))
    fields = decode_oom(info)
    if not fields:
        raise ConfigError("the message says it is out of memory but states no size memlab can read: paste it "
                          "whole, with 'Tried to allocate ...'")
    return {"message_format": info.message_format, "device_type": info.device_type, **oom_kind(info),
            "fields": fields}


def _levers(args: argparse.Namespace) -> dict[str, Any] | None:
    """With a model (``--hf``, ``--preset``, dimensions): ``memlab estimate --levers``'s answer for it on ``--gpu``
    (:func:`memlab.cli.estimate.lever_answers`, the same code), or None without one."""
    from memlab.cli.args import given_model_options

    if args.hf is None and not given_model_options(args) and getattr(args, "model_spec", None) is None:
        return None
    if args.gpu is None:
        raise ConfigError("the levers need the card: add --gpu NAME (see 'memlab gpus')")
    from memlab.cli.estimate import lever_answers

    return lever_answers(args)


def run(args: argparse.Namespace) -> int:
    """``memlab oom``: print the message's kind and what to try, then each field it states; with a model and
    ``--gpu``, the levers that make the step fit."""
    result = decoded(_source(args))
    found = _levers(args)
    if found is not None:
        result["levers"] = found
    if args.json:
        print_json(result, indent=2)
        return 0
    print(f"kind: {result['kind']} ({result['message_format']} message)")
    known = result["kind"] != "unknown"  # without free and cached sizes, the request's own advice is all there is
    print(f"{'why and what to try' if known else 'what to try'}: "
          f"{result['why'] if known else result['fields'][0]['for the fix']}")
    print()
    width = max(len(f["field"]) for f in result["fields"])
    print(f"{'field':<{width}} {'GiB':>9}  meaning; for the fix")
    for f in result["fields"]:
        print(f"{f['field']:<{width}} {f['GiB']:>9.3f}  {f['meaning']}; {f['for the fix']}")
    print("(GiB = 2**30 bytes; the message prints two decimals, so each value is exact to half its last digit)")
    if found is not None:
        from memlab.cli.estimate import print_lever_answers

        print_lever_answers(found)
    return 0
