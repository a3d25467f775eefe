"""memlab.cli.args: the Setup options are generated once from the dataclass, so every subcommand shares its
defaults, flags and help with ``memlab.Setup``."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from memlab.cli import COMMANDS, build_parser
from memlab.cli.args import model_from_args, setup_from_args, setup_options
from memlab.cli.measure import SHARDING_FIELDS
from memlab.errors import MemlabError
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup


def _sub(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _options(name: str) -> dict[str, argparse.Action]:
    return {a.dest: a for a in _sub(name)._actions}


def test_every_setup_field_is_an_option_of_estimate_with_its_docstring_and_default() -> None:
    opts = _options("estimate")
    for f in dataclasses.fields(Setup):
        assert f.name in opts, f"Setup.{f.name} has no estimate option"
        assert f"(default: {f.metadata.get('cli_default', f.default)}" in opts[f.name].help
    assert all(o.help for o in setup_options()), "every Setup field needs a docstring: it is the --help text"


@pytest.mark.parametrize("command", ["estimate", "measure"])
def test_unset_options_give_exactly_setup_defaults(command: str) -> None:
    args = build_parser().parse_args([command, "--preset", "gpt2"])
    model = model_from_args(args)
    assert setup_from_args(args, model) == Setup(seq=min(Setup().seq, model.max_seq))


def test_estimate_and_measure_share_flags_choices_and_defaults() -> None:
    est, mea = _options("estimate"), _options("measure")
    shared = [f.name for f in dataclasses.fields(Setup) if f.name not in SHARDING_FIELDS]
    for name in shared:
        a, b = est[name], mea[name]
        assert (a.option_strings, a.choices, a.help, a.default) == (b.option_strings, b.choices, b.help, b.default)
    assert not any(name in mea for name in SHARDING_FIELDS), "measure runs one device: no sharding options"


def test_given_options_reach_the_setup() -> None:
    argv = ["estimate", "--preset", "llama-2-7b", "--seq", "4096", "--precision", "mixed-bf16", "--zero", "3",
            "--world-size", "8", "--sp", "--tp", "2"]
    args = build_parser().parse_args(argv)
    setup = setup_from_args(args, preset("llama-2-7b"))
    assert (setup.seq, setup.precision, setup.zero_stage, setup.world_size, setup.sp, setup.tp) == (
        4096, "mixed-bf16", 3, 8, True, 2)
    argv = ["estimate", "--preset", "llama-2-7b", "--mode", "inference", "--weights", "int4", "--kv-dtype", "fp8"]
    setup = setup_from_args(build_parser().parse_args(argv), preset("llama-2-7b"))
    assert (setup.mode, setup.inference_weights, setup.kv_cache_dtype) == ("inference", "int4", "fp8")


@pytest.mark.parametrize(("argv", "says"), [
    (["--weights", "int4"], "only for inference"), (["--kv-dtype", "fp8"], "only for inference"),
    (["--mode", "inference", "--precision", "bf16"], "only for training"),
    (["--mode", "inference", "--optimizer", "sgd"], "only for training"),
])
def test_an_option_of_the_other_mode_is_refused_not_ignored(argv: list[str], says: str) -> None:
    args = build_parser().parse_args(["estimate", "--preset", "tiny-gpt", *argv])
    with pytest.raises(MemlabError, match=says):
        setup_from_args(args, preset("tiny-gpt"))


def test_every_command_is_registered_once() -> None:
    names = [c.name for c in COMMANDS]
    assert len(names) == len(set(names)) and {"estimate", "measure", "mfu", "gpus", "ledger", "report"} <= set(names)
