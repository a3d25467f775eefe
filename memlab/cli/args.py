"""The ``memlab`` command's arguments, declared once.

Argument types turn text into checked values (an ``argparse.ArgumentTypeError`` becomes the one-line error).
The model options (``--preset`` | explicit dimensions | ``--params``) are declared here for every subcommand.
The Setup options are **generated** from :class:`memlab.predict.setup.Setup`'s fields: the flag is the field name
(or ``metadata["flag"]``), the help is the field's docstring, the choices come from its ``Literal`` type or
``metadata["choices"]``, and the default is the field's default, so ``estimate`` and ``measure`` share one set.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import typing
from typing import Any

from memlab.errors import MemlabError


# -- argument types ---------------------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """A whole number > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _float_in(text: str, lo: float, hi: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not lo <= value < hi:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _float_in(text, 0.0, float("inf"), "a non-negative number")


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    return _float_in(text, 0.0, 1.0, "a fraction in [0, 1)")


def param_count(text: str) -> int:
    """A parameter count: 124439808, 7.5e9, 7B, 350M, 1.5T (K/M/B/T = 1e3/1e6/1e9/1e12)."""
    scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}.get(text.strip()[-1:].lower(), 1)
    body = text.strip()[:-1] if scale != 1 else text.strip()
    try:
        value = float(body) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a parameter count like 7e9 or 7B, got {text!r}") from None
    if not 1 <= value < 1e16 or value != round(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole parameter count, got {text!r}")
    return round(value)


# -- the model --------------------------------------------------------------------------------------------------
_DIM_ONLY = ("n_kv_heads", "d_ff", "vocab", "mlp", "max_seq", "untied", "positions", "norm", "no_bias")


def add_model_arguments(p: argparse.ArgumentParser, *, allow_params: bool = True) -> None:
    """MODEL := --preset NAME | --d-model H --n-layers L --n-heads A [...] | --params P."""
    what = "--preset, explicit dimensions" + (", --params" if allow_params else "")
    g = p.add_argument_group(f"model (exactly one of: {what})")
    from memlab.predict.models import preset_names

    g.add_argument("--preset", metavar="NAME", help=f"a preset: {', '.join(preset_names())}")
    g.add_argument("--d-model", type=positive_int, metavar="H")
    g.add_argument("--n-layers", type=positive_int, metavar="L")
    g.add_argument("--n-heads", type=positive_int, metavar="A")
    g.add_argument("--n-kv-heads", type=positive_int, metavar="K", help="KV heads (GQA/MQA); default A")
    g.add_argument("--d-ff", type=positive_int, metavar="F", help="MLP width; default 4H (gelu) or Llama rule")
    g.add_argument("--vocab", type=positive_int, metavar="V", help="vocabulary size (default 50257)")
    g.add_argument("--mlp", choices=("gelu", "swiglu"))
    g.add_argument("--max-seq", type=positive_int, metavar="S", help="default max(1024, --seq)")
    g.add_argument("--untied", action="store_true", help="separate LM head (default: tied to the embedding)")
    g.add_argument("--positions", choices=("learned", "rotary"))
    g.add_argument("--norm", choices=("layernorm", "rmsnorm"))
    g.add_argument("--no-bias", action="store_true", help="no biases on linear layers and norms")
    if allow_params:
        g.add_argument("--params", type=param_count, metavar="P", help="a bare parameter count: model states only")


def model_from_args(args: argparse.Namespace) -> Any:
    """The TransformerConfig (or bare parameter count) the MODEL options describe; MemlabError when ambiguous."""
    from memlab.predict.models import TransformerConfig, preset

    dims = [args.d_model, args.n_layers, args.n_heads]
    params = getattr(args, "params", None)
    chosen = [name for name, given in (("--preset", args.preset is not None), ("explicit dimensions", any(dims)),
                                       ("--params", params is not None)) if given]
    if len(chosen) != 1:
        what = " and ".join(chosen) if chosen else "none"
        forms = "--preset NAME, or --d-model/--n-layers/--n-heads" + (", or --params P" if hasattr(args, "params")
                                                                        else "")
        raise MemlabError(f"give exactly one model: {forms} (got {what})")
    extra = [f"--{k.replace('_', '-')}" for k in _DIM_ONLY if getattr(args, k) not in (None, False)]
    if chosen[0] != "explicit dimensions":
        if extra:
            raise MemlabError(f"{', '.join(extra)} only apply to explicit dimensions, not to {chosen[0]}")
        return preset(args.preset) if args.preset is not None else params
    if not all(dims):
        raise MemlabError("explicit dimensions need all of --d-model, --n-layers and --n-heads")
    fields: dict[str, Any] = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
                              "n_kv_heads": args.n_kv_heads, "d_ff": args.d_ff, "tied_embeddings": not args.untied,
                              "bias": not args.no_bias,
                              "max_seq": args.max_seq or max(1024, getattr(args, "seq", None) or 0)}
    for key, value in (("vocab_size", args.vocab), ("mlp", args.mlp), ("positions", args.positions),
                       ("norm", args.norm)):
        if value is not None:
            fields[key] = value
    return TransformerConfig(**fields)


# -- the setup, generated from its dataclass --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SetupOption:
    """One generated option: the Setup field it sets, its flag, and how argparse reads it."""

    field: str
    flag: str
    help: str
    default: Any
    kind: str
    """``bool``, ``int``, ``float`` or ``str``."""
    choices: tuple[Any, ...] | None


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass, read from its source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@functools.cache
def setup_options() -> tuple[SetupOption, ...]:
    """Every Setup field as a CLI option, in field order."""
    from memlab.predict.setup import Setup

    hints = typing.get_type_hints(Setup)
    docs = _field_docs(Setup)
    out = []
    for f in dataclasses.fields(Setup):
        hint = hints[f.name]
        choices = f.metadata.get("choices")
        if typing.get_origin(hint) is typing.Literal:
            choices = typing.get_args(hint)
            kind = type(choices[0]).__name__
        else:
            kind = {bool: "bool", int: "int", float: "float"}.get(hint, "str")
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        out.append(SetupOption(f.name, flag, docs.get(f.name, ""), f.default, kind,
                               tuple(choices) if choices is not None else None))
    return tuple(out)


def add_setup_arguments(p: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """Add one option per Setup field (less ``exclude``); every default is Setup's own (shown in ``--help``)."""
    g = p.add_argument_group("setup (defaults are memlab.Setup's)")
    for opt in setup_options():
        if opt.field in exclude:
            continue
        text = f"{opt.help.replace('``', '')} (default: {opt.default})"
        if opt.kind == "bool":
            g.add_argument(opt.flag, dest=opt.field, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        conv = {"int": non_negative_int if opt.default == 0 else positive_int, "float": positive_float,
                "str": str}[opt.kind]
        g.add_argument(opt.flag, dest=opt.field, type=conv, choices=opt.choices, default=None,
                       metavar=None if opt.choices else {"int": "N", "float": "X"}.get(opt.kind, "VALUE"), help=text)


def given_setup_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Setup fields the user gave on the command line (the rest keep Setup's defaults)."""
    return {o.field: getattr(args, o.field) for o in setup_options() if getattr(args, o.field, None) is not None}


def setup_from_args(args: argparse.Namespace, model: Any, **overrides: Any) -> Any:
    """The :class:`Setup` the options describe. An unset ``--seq`` is Setup's default lowered to the model's
    ``max_seq`` when that is shorter; ``overrides`` win over the command line (e.g. ``--fsdp`` on estimate)."""
    from memlab.predict.models import TransformerConfig
    from memlab.predict.setup import Setup

    values = {**given_setup_fields(args), **overrides}
    if "seq" not in values and isinstance(model, TransformerConfig):
        values["seq"] = min(Setup().seq, model.max_seq)
    return Setup(**values)
