"""memlab.device: the one device/scale/dtype resolver."""

from __future__ import annotations

import pytest
import torch

from memlab.device import canonical_device, device_string, device_type, resolve_device, resolve_scale, torch_dtype
from memlab.errors import MemlabError, SetupError, UnknownNameError

CUDA = torch.cuda.is_available()
GIB, MIB = 2**30, 2**20


@pytest.mark.parametrize("bad", ["garbage", "", "tpu", "mps", "meta", "cuda:x", -1, True, 1.5, object()])
def test_bad_devices_get_one_setup_error_naming_the_forms(bad):
    with pytest.raises(SetupError, match="device must be 'auto', 'cpu', 'cuda'"):
        resolve_device(bad)


@pytest.mark.parametrize("name", ["cpu", " CPU ", "Cpu", "cpu:0", torch.device("cpu")])
def test_cpu_names_resolve_to_the_cpu(name):
    assert resolve_device(name) == torch.device("cpu") and device_string(name) == "cpu"


@pytest.mark.skipif(CUDA, reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", 0])
def test_cuda_without_a_gpu_is_a_clear_error(name):
    with pytest.raises(SetupError, match="no CUDA GPU"):
        resolve_device(name)


def test_auto_and_none_pick_cuda_when_present_else_the_cpu():
    expected = "cuda:0" if CUDA else "cpu"
    assert device_string("auto") == device_string(None) == device_string(" AUTO ") == expected


@pytest.mark.parametrize(("name", "kind", "recorded"), [
    ("cpu", "cpu", "cpu"), (" CPU:0 ", "cpu", "cpu"), (torch.device("cpu"), "cpu", "cpu"),
    ("cuda", "cuda", "cuda:0"), ("CUDA:3", "cuda", "cuda:3"), (2, "cuda", "cuda:2"),
    (torch.device("cuda", 1), "cuda", "cuda:1"),
])
def test_type_and_recorded_name_are_read_without_asking_this_machine(name, kind, recorded):
    assert device_type(name) == kind and canonical_device(name) == recorded  # a GPU's record reads on a laptop


def test_auto_type_and_name_are_this_machines():
    assert device_type("auto") == device_type(None) == ("cuda" if CUDA else "cpu")
    assert canonical_device("auto") == device_string("auto")


@pytest.mark.parametrize("bad", ["tpu", "meta", "cuda:x", -1, True, torch.device("meta")])
def test_type_and_recorded_name_refuse_what_the_resolver_refuses(bad):
    for read in (device_type, canonical_device):
        with pytest.raises(SetupError, match="device must be 'auto', 'cpu', 'cuda'"):
            read(bad)


def test_resolving_creates_no_cuda_context():
    before = torch.cuda.is_initialized()  # True only if an earlier test used CUDA
    resolve_device("auto"), device_type("auto"), canonical_device("cuda")
    assert torch.cuda.is_initialized() == before


def test_scale_auto_follows_the_device_and_explicit_scales_are_kept():
    assert resolve_scale("auto", "cpu") == "ci"
    assert resolve_scale("full", "cpu") == "full" and resolve_scale("ci", "auto") == "ci"
    with pytest.raises(MemlabError, match="scale must be one of"):
        resolve_scale("huge")


def test_torch_dtype_maps_memlab_names_and_refuses_others():
    assert torch_dtype("bf16") is torch.bfloat16 and torch_dtype("tf32") is torch.float32
    with pytest.raises(UnknownNameError):
        torch_dtype("fp7")
    with pytest.raises(MemlabError, match="no dense torch tensor type"):
        torch_dtype("int4")


RUN_DEVICE_DEFAULTS: dict[str, str] = {
    "memlab.compare.sharding.predicted_rank": "compared with the gloo ranks run on this machine's CPU",
    "memlab.studies.calculators.full_size_runs": "the runs of a campaign execute on this machine's CPU",
    "memlab.studies.calculators.lora_runs": "the runs of a campaign execute on this machine's CPU",
    "memlab.run.spec.Run": "a run's own device: where it executes, this machine's CPU unless told",
    "memlab.measure.oom.OomInfo": "the device an OOM message names, parsed: None when it names none",
}
"""``device_type`` defaults that say where a run EXECUTES (or what a message named), not what a prediction is for;
each with why."""


def _device_type_defaults() -> dict[str, object]:
    """``qualified name -> default`` of every ``device_type`` argument (and dataclass field) in memlab; a required
    one has no entry."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out: dict[str, object] = {}
    for path in sorted((root / "memlab").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                positional = args.posonlyargs + args.args
                pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
                pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
                out.update({f"{module}.{node.name}": ast.literal_eval(d) for a, d in pairs
                            if a.arg == "device_type" and isinstance(d, ast.Constant)})
            if isinstance(node, ast.ClassDef):
                out.update({f"{module}.{node.name}": ast.literal_eval(item.value) for item in node.body
                            if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", "") == "device_type"
                            and isinstance(item.value, ast.Constant)})
    return out


def test_one_default_device_type_everywhere() -> None:
    """Every device a prediction or a trace is made for defaults to DEFAULT_DEVICE_TYPE (a CUDA GPU: what users run),
    or must be given; only the listed run campaigns default to where they execute."""
    from memlab.predict.spec.setup import DEFAULT_DEVICE_TYPE

    defaults = _device_type_defaults()
    other = {name: d for name, d in defaults.items() if d != DEFAULT_DEVICE_TYPE and name not in RUN_DEVICE_DEFAULTS}
    assert not other, f"device_type defaults other than {DEFAULT_DEVICE_TYPE!r}: {other}"
    stale = [name for name in RUN_DEVICE_DEFAULTS if name not in defaults or defaults[name] == DEFAULT_DEVICE_TYPE]
    assert not stale, f"these no longer default elsewhere: delete their RUN_DEVICE_DEFAULTS entries {stale}"
    assert len(defaults) > 20  # the scan sees the estimator's, the tracer's and the CLI's signatures
