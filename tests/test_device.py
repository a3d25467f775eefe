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
