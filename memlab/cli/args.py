"""The ``memlab`` command's arguments, declared once.

Argument types turn text into checked values (an ``argparse.ArgumentTypeError`` becomes the one-line error).
The model options (``--model`` | ``--preset`` | explicit dimensions | ``--params``) are declared here for every
subcommand. ``--model SPEC`` takes every spelling of :func:`memlab.predict.families.resolve` (``ref:NAME`` the
reference GPT, ``NAME`` or ``hf:NAME`` a published config memlab ships, a config.json path or folder, a cached model
id ``org/name``) and is routed at parse time to what the older flags do (:class:`ModelSpec`): ``--model ref:NAME``
is ``--preset ref:NAME``, any other spelling ``--hf`` (the config.json it names), so each answers the same.
The Setup options are **generated** from :class:`memlab.predict.spec.setup.Setup`'s fields: the flag is the field name
(or ``metadata["flag"]``), the help is the field's docstring, the choices come from its ``Literal`` type or
``metadata["choices"]``, and the default is the field's default, so ``estimate`` and ``measure`` share one set.
Size options are bounded by the same ``metadata["max"]`` (and its reason) the dataclasses enforce, so a huge value
is refused with the limit before any work. Devices go through :func:`memlab.device.resolve_device`
(:func:`device_arg`); output paths are checked up front (:func:`output_file`, :func:`output_dir`) and written
inside :func:`writing`; ``--json`` goes through :func:`print_json` (never NaN or Infinity).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import math
import os
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError

MIB = 2**20
MAX_MIB = 2**30
"""The most MiB an overhead flag takes: 2**30 MiB = 1 PiB (the API's Overheads bound)."""


# -- argument types ---------------------------------------------------------------------------------------------
def bounded_int(lo: int, hi: int, why: str) -> Callable[[str], int]:
    """An argument type: a whole number in [lo, hi]; the error says the limit and ``why``."""

    def parse(text: str) -> int:
        value = (non_negative_int if lo == 0 else positive_int)(text)
        if value < lo or value > hi:
            raise argparse.ArgumentTypeError(f"expected at most {hi:,} ({why}), got {_short(text)}")
        return value

    parse.__name__ = "bounded_int"
    return parse


def _short(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[: limit - 3] + "...")


def field_bound(cls: type, name: str) -> Callable[[str], int]:
    """The argument type of an int field of ``cls``, bounded by its ``metadata`` (max and the reason)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    lo = f.metadata.get("min", 0 if f.default == 0 else 1)
    hi = f.metadata.get("max")
    return bounded_int(lo, hi, f.metadata.get("why", "")) if hi is not None else (
        non_negative_int if lo == 0 else positive_int)


def mebibytes(text: str) -> float:
    """A size in MiB, >= 0 and at most :data:`MAX_MIB` (1 PiB)."""
    value = non_negative_float(text)
    if value > MAX_MIB:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_MIB:,} MiB (1 PiB, over 1000x any accelerator's "
                                         f"memory), got {_short(text)}")
    return value


def gpu_name(text: str) -> str:
    """A GPU of memlab's table (key, spelling or torch name); unknown names list the closest ones."""
    from memlab.predict.hardware.gpus import gpu

    try:
        return gpu(text).key
    except MemlabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def device_arg(text: str) -> str:
    """A device this process can use, through the one resolver :func:`memlab.device.resolve_device`
    (``auto``, ``cpu``, ``cuda``, ``cuda:N``); garbage, ``''``, ``mps``, ``meta`` or CUDA without a GPU are refused
    before any work starts."""
    from memlab.device import device_string

    try:
        return device_string(text)
    except MemlabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_parents(path: Path) -> None:
    """Refuse a path whose folder chain holds a file, or whose name is longer than the file system allows."""
    for part in path.parts:
        if len(part.encode(errors="surrogateescape")) > 255:
            raise argparse.ArgumentTypeError(f"{_short(str(path))}: a name in the path is longer than 255 bytes")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{_short(str(path))}: {str(parent)!r} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK) and not path.exists():
                raise argparse.ArgumentTypeError(f"{_short(str(path))}: folder {str(parent)!r} is not writable")
            return


def output_file(text: str) -> Path:
    """A file memlab may create or append to: not a folder, not a FIFO or device (``/dev/null``, ``/dev/full``),
    not under a file, a writable location. Missing parent folders are created when it is written."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got ''")
    path = Path(text)
    _check_parents(path)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{_short(text)} is a folder: give a file path inside it")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{_short(text)} is not a regular file (a FIFO, device or socket): give a "
                                         "file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{_short(text)} is not writable")
    return path


def output_dir(text: str) -> Path:
    """A folder memlab may create and write into (not a file, not under a file, writable)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder path, got ''")
    path = Path(text)
    _check_parents(path)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{_short(text)} exists and is not a folder: give a folder path")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"folder {_short(text)} is not writable")
    return path


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an OSError raised while writing ``path`` (disk full, permissions, a vanished folder) into the one-line
    :class:`MemlabError`."""
    try:
        yield
    except OSError as exc:
        raise MemlabError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def clean_json(obj: Any) -> Any:
    """``obj`` with every NaN or infinity replaced by None (JSON has neither), recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    return obj


def print_json(obj: Any, **kwargs: Any) -> None:
    """Print ``obj`` as strict JSON: non-finite numbers become null, never ``NaN``/``Infinity``."""
    print(json.dumps(clean_json(obj), allow_nan=False, **kwargs))


def positive_int(text: str) -> int:
    """A whole number > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {_short(text)}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {_short(text)}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {_short(text)}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {_short(text)}")
    return value


def _float_in(text: str, lo: float, hi: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not lo <= value < hi:
        raise argparse.ArgumentTypeError(f"expected {what}, got {_short(text)}")
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
        raise argparse.ArgumentTypeError(f"expected a parameter count like 7e9 or 7B, got {_short(text)}") from None
    if not 1 <= value < 1e16 or value != round(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole parameter count, got {_short(text)}")
    return round(value)


# -- the model --------------------------------------------------------------------------------------------------
class ModelSpec(argparse.Action):
    """``--model SPEC``, checked and routed when parsed: ``ref:NAME`` (checked against the presets) sets ``preset``;
    any other spelling sets ``hf`` to the config.json it names where the command has ``--hf``, else
    ``model_config`` (read by :func:`model_from_args`). A bad spec is the one-line usage error."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from memlab.predict.families.resolver import locate, resolve

        spec = str(values)
        try:
            if spec.startswith("ref:"):
                resolve(spec)  # an unknown preset: one line with the closest names
                dest, value = "preset", spec
            else:
                dest, value = ("hf" if hasattr(namespace, "hf") else "model_config"), locate(spec)
        except MemlabError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        if getattr(namespace, dest, None) is not None:
            raise argparse.ArgumentError(self, f"give the model once: --model or --{dest.replace('_', '-')}")
        setattr(namespace, dest, value)
        namespace._model_routed = dest, value
        setattr(namespace, self.dest, spec)


def check_model_spec(args: argparse.Namespace) -> None:
    """After parsing: ``--model`` and the flag it was routed to (``--preset``, ``--hf``) given both, in that order,
    is one error (the later flag would silently win)."""
    routed = getattr(args, "_model_routed", None)
    if routed is not None and getattr(args, routed[0], None) != routed[1]:
        raise MemlabError(f"give the model once: --model or --{routed[0].replace('_', '-')}")


def _resolve(spec: str) -> Any:
    """:func:`memlab.predict.families.resolve` of ``spec``."""
    from memlab.predict.families.resolver import resolve

    return resolve(spec)


def _preset_model(text: str) -> Any:
    """The model ``--preset TEXT`` names: a preset with a published config memlab ships (gpt2, llama-2-7b,
    llama-2-13b, mistral-7b) is that model as its published code runs it (``resolve(NAME)``, the object ``--hf
    NAME`` and ``--model NAME`` give); ``ref:NAME`` is the reference GPT with NAME's sizes; any other preset
    (tiny-gpt, gpt-3-175b, ...) is the reference GPT (memlab ships no config of that name)."""
    from memlab.predict.families.resolver import shipped
    from memlab.predict.spec.model import preset

    if text.startswith("ref:"):
        return _resolve(text)
    cfg = preset(text)  # unknown names: one line with the closest ones
    return _resolve(f"hf:{cfg.name}") if shipped(cfg.name) is not None else cfg


_DIM_ONLY = ("n_kv_heads", "d_ff", "vocab", "mlp", "untied", "positions", "norm", "no_bias")


def add_model_arguments(p: argparse.ArgumentParser, *, allow_params: bool = True) -> None:
    """MODEL := --model SPEC | --preset NAME | --d-model H --n-layers L --n-heads A [...] | --params P."""
    what = "--model, --preset, explicit dimensions" + (", --params" if allow_params else "")
    g = p.add_argument_group(f"model (exactly one of: {what})")
    from memlab.predict.spec.model import MLPS, NORMS, POSITIONS, TransformerConfig, preset_names

    def dim(name: str) -> Callable[[str], int]:
        return field_bound(TransformerConfig, name)

    from memlab.cli.hf_source import published_presets

    g.add_argument("--model", dest="model_spec", action=ModelSpec, metavar="SPEC", help=(
        "the model, named once for Python and the command line (memlab.resolve(SPEC)): ref:NAME is the reference "
        "GPT with NAME's sizes (memlab.preset(NAME) in Python); NAME or hf:NAME a published config memlab ships ("
        "full-size: see memlab.predict.families.resolver.config_names); or the path of a config.json or its "
        "folder, or a Hugging Face model id org/name in the local cache (never downloaded)"))
    g.add_argument("--preset", metavar="NAME", help="a preset: a name memlab ships a published config of ("
                   f"{', '.join(published_presets())}) is that model as its published code runs it (= --hf NAME); "
                   "ref:NAME is the reference GPT with NAME's sizes; the other presets are the reference GPT: "
                   f"{', '.join(preset_names())}. Note the two meanings of 'preset': here a published name is the "
                   "published model, while memlab.preset(NAME) in Python is always the reference GPT; --model "
                   "NAME / --model ref:NAME say which")
    g.add_argument("--d-model", type=dim("d_model"), metavar="H")
    g.add_argument("--n-layers", type=dim("n_layers"), metavar="L")
    g.add_argument("--n-heads", type=dim("n_heads"), metavar="A")
    g.add_argument("--n-kv-heads", type=dim("n_kv_heads"), metavar="K", help="KV heads (GQA/MQA); default A")
    g.add_argument("--d-ff", type=dim("d_ff"), metavar="F", help="MLP width; default 4H (gelu) or Llama rule")
    g.add_argument("--vocab", type=dim("vocab_size"), metavar="V", help="vocabulary size (default 50257)")
    g.add_argument("--mlp", choices=MLPS)
    g.add_argument("--max-seq", type=dim("max_seq"), metavar="S",
                   help="longest sequence (learned position rows); default max(1024, --seq); with --preset it "
                        "replaces a rotary preset's max_seq (a learned-position preset keeps its table)")
    g.add_argument("--untied", action="store_true", help="separate LM head (default: tied to the embedding)")
    g.add_argument("--positions", choices=POSITIONS)
    g.add_argument("--norm", choices=NORMS)
    g.add_argument("--no-bias", action="store_true", help="no biases on linear layers and norms")
    if allow_params:
        g.add_argument("--params", type=param_count, metavar="P", help="a bare parameter count: model states only")


def given_model_options(args: argparse.Namespace) -> list[str]:
    """The model options (:func:`add_model_arguments`) ``args`` sets, as flags: for commands whose model may come
    from elsewhere (``--hf``), where any of them would be silently ignored."""
    keys = ("preset", "d_model", "n_layers", "n_heads", *_DIM_ONLY, "max_seq", "params")
    return [f"--{k.replace('_', '-')}" for k in keys if getattr(args, k, None) not in (None, False)]


def model_from_args(args: argparse.Namespace) -> Any:
    """The TransformerConfig (or bare parameter count) the MODEL options describe; MemlabError when ambiguous."""
    from memlab.predict.spec.model import TransformerConfig

    config = getattr(args, "model_config", None)  # --model SPEC on a command without --hf: its config.json
    dims = [args.d_model, args.n_layers, args.n_heads]
    params = getattr(args, "params", None)
    chosen = [name for name, given in (("--model", config is not None), ("--preset", args.preset is not None),
                                       ("explicit dimensions", any(dims)),
                                       ("--params", params is not None)) if given]
    if len(chosen) != 1:
        what = " and ".join(chosen) if chosen else "none"
        forms = "--model SPEC, --preset NAME, or --d-model/--n-layers/--n-heads" + (
            ", or --params P" if hasattr(args, "params") else "")
        raise MemlabError(f"give exactly one model: {forms} (got {what})")
    extra = [f"--{k.replace('_', '-')}" for k in _DIM_ONLY if getattr(args, k) not in (None, False)]
    if chosen[0] != "explicit dimensions":
        if extra:
            raise MemlabError(f"{', '.join(extra)} only apply to explicit dimensions, not to {chosen[0]}")
        if args.preset is None and config is None:
            if args.max_seq is not None:
                raise MemlabError("--max-seq describes a model config; a bare --params count has no positions")
            return params
        # a shipped published config, or ref:NAME / another preset: reference GPT; or the config --model names
        cfg = _preset_model(args.preset) if config is None else _resolve(config)
        if args.max_seq is not None and cfg.positions == "learned" and args.max_seq != cfg.max_seq:
            # Another table size is another model: its parameter count, and every byte after it, would change
            raise MemlabError(f"--max-seq {args.max_seq}: {cfg.name} has learned positions, a table of "
                              f"{cfg.max_seq:,} rows, so it reads at most {cfg.max_seq:,} tokens; another size is "
                              "another model: describe it with explicit dimensions (--d-model, --n-layers, "
                              "--n-heads, --max-seq) or use a rotary preset")
        return cfg.with_(max_seq=args.max_seq) if args.max_seq is not None else cfg
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
    """The command line's default: the field's, or its ``metadata["cli_default"]`` (attention: auto)."""
    kind: str
    """``bool``, ``int``, ``float`` or ``str``."""
    choices: tuple[Any, ...] | None
    mode: str | None = None
    """``train`` or ``inference`` when the field only applies in that mode (``metadata["mode"]``)."""
    aliases: tuple[str, ...] = ()
    """Other spellings of the flag (``metadata["aliases"]``), e.g. ``--schedule`` for ``--pp-schedule``."""


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
    from memlab.predict.spec.setup import Setup

    hints = typing.get_type_hints(Setup)
    docs = _field_docs(Setup)
    out = []
    for f in dataclasses.fields(Setup):
        hint = hints[f.name]
        if typing.get_origin(hint) is types.UnionType:  # ``int | None``: an int whose default depends on the mode
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        choices = f.metadata.get("choices")
        if typing.get_origin(hint) is typing.Literal:
            choices = typing.get_args(hint)
            kind = type(choices[0]).__name__
        else:
            kind = {bool: "bool", int: "int", float: "float"}.get(hint, "str")
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        out.append(SetupOption(f.name, flag, docs.get(f.name, ""), f.metadata.get("cli_default", f.default), kind,
                               tuple(choices) if choices is not None else None, f.metadata.get("mode"),
                               tuple(f.metadata.get("aliases", ()))))
    return tuple(out)


def add_setup_arguments(p: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """Add one option per Setup field (less ``exclude``); every default is Setup's own (shown in ``--help``)."""
    from memlab.predict.spec.setup import SETUP_GROUPS, Setup

    titled = {name: p.add_argument_group(f"setup: {name} (defaults are memlab.Setup's, but estimate's --attention)")
              for name in SETUP_GROUPS}
    groups = {field: titled[name] for name, fields in SETUP_GROUPS.items() for field in fields}
    for opt in setup_options():
        if opt.field in exclude:
            continue
        g = groups[opt.field]
        text = f"{opt.help.replace('``', '')} (default: {opt.default}" + (
            f"; memlab trace and measure: {Setup.__dataclass_fields__[opt.field].default})"
            if opt.default != Setup.__dataclass_fields__[opt.field].default else ")")
        if opt.kind == "bool":
            g.add_argument(opt.flag, *opt.aliases, dest=opt.field, action=argparse.BooleanOptionalAction,
                           default=None, help=text)
            continue
        conv: Callable[[str], Any] = (field_bound(Setup, opt.field) if opt.kind == "int"
                                      else positive_float if opt.kind == "float" else str)
        spellings = Setup.__dataclass_fields__[opt.field].metadata.get("spellings")
        if spellings:  # another library's names for the same choices (--optimizer paged_adamw_8bit)
            conv = functools.partial(_spelled, dict(spellings))
            text = text[:-1] + f"; also {', '.join(spellings)})"
        g.add_argument(opt.flag, *opt.aliases, dest=opt.field, type=conv, choices=opt.choices, default=None,
                       metavar=None if opt.choices else {"int": "N", "float": "X"}.get(opt.kind, "VALUE"), help=text)


def _spelled(spellings: dict[str, str], text: str) -> str:
    """``text`` in memlab's spelling: another library's name (a Setup field's ``metadata["spellings"]``) mapped."""
    return spellings.get(text.strip().lower(), text)


def given_setup_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Setup fields the user gave on the command line (the rest keep Setup's defaults)."""
    return {o.field: getattr(args, o.field) for o in setup_options() if getattr(args, o.field, None) is not None}


def setup_from_args(args: argparse.Namespace, model: Any, *, device_type: str = "cuda", library_defaults: bool = False,
                    **overrides: Any) -> Any:
    """The :class:`~memlab.predict.spec.setup.Setup` the options describe. An unset ``--seq`` is Setup's default lowered
    to the model's ``max_seq`` when that is shorter; ``overrides`` win over the command line (e.g. ``--fsdp`` on
    estimate). With ``library_defaults`` (``memlab estimate``) an unset option takes its ``cli_default`` (attention:
    ``auto``); ``auto`` is the kernel the libraries run for this model on ``device_type`` (and ``--gpu``'s compute
    capability): :func:`memlab.predict.spec.kernels.resolved`, its reason left in ``args.assumed_attention``; for a
    bare count or a config the formula does not read it stays ``auto`` (the trace resolves it)."""
    from memlab.predict.spec.model import TransformerConfig
    from memlab.predict.spec.setup import INFERENCE_WEIGHTS, Setup

    given = given_setup_fields(args)
    mode = given.get("mode", Setup().mode)
    # An option of the other mode would be ignored silently: a training option under --mode inference (the usual
    # slip: --precision fp16 for fp16 weights), or an inference one (--weights int4) under training.
    wrong = [o for o in setup_options() if o.field in given and o.mode is not None and o.mode != mode]
    if wrong:
        flags = ", ".join(f"{o.flag} {given[o.field]}" for o in wrong)
        if mode == "inference":
            raise MemlabError(f"{flags}: only for training, ignored by --mode inference; inference weights are "
                              f"--weights ({', '.join(INFERENCE_WEIGHTS)}) and the KV cache --kv-dtype")
        raise MemlabError(f"{flags}: only for inference, ignored by training (the default --mode train): add "
                          "--mode inference, or drop it; training precision is --precision")
    cli_defaults = {o.field: o.default for o in setup_options()
                    if library_defaults and o.default != Setup.__dataclass_fields__[o.field].default}
    values = {**cli_defaults, **given, **overrides}  # e.g. attention: unnamed, the kernel the libraries run
    if values.get("finetune") == "qlora" and "precision" not in values:
        # QLoRA computes in bf16 over its 4-bit base (bnb_4bit_compute_dtype); a card without bf16 (below sm80: a T4,
        # a V100) runs its fp16 recipe, amp-fp16 (bnb_4bit_compute_dtype=float16 under Trainer(fp16=True))
        from memlab.predict.spec.kernels import capability_of

        cc = capability_of(getattr(args, "gpu", None))
        values["precision"] = "amp-fp16" if cc is not None and cc < (8, 0) else "bf16"
    if "seq" not in values and isinstance(model, TransformerConfig):
        values["seq"] = min(Setup().seq, model.max_seq)
    setup = Setup(**values)
    if not isinstance(model, TransformerConfig):
        return setup  # a bare count (attention moves no state) or a config the trace resolves itself
    from memlab.predict.spec.kernels import resolved

    setup, why = resolved(model, setup, device_type=device_type, gpu=getattr(args, "gpu", None))
    args.assumed_attention = why  # printed first by the command (None: the user named the kernel)
    return setup
