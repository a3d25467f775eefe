"""Issue 8, section 2: bad input to any public entry point is ONE MemlabError naming the field (never a foreign
exception, never a silent wrong result). One parametrised table of bad inputs per entry point."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Literal

import numpy as np
import pytest

from memlab.course.exercises import Numeric
from memlab.errors import MemlabError, SetupError
from memlab.predict.compute import flops
from memlab.predict.estimate import Overheads, estimate, sweep_totals
from memlab.predict.hardware.gpus import gpu, resolve
from memlab.predict.hardware.table import Accelerator
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.precision import precision_policy
from memlab.predict.spec.setup import Setup, SetupView
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_fields, field_rules

TINY = preset("tiny-gpt")
DIMS = {"d_model": 64, "n_layers": 2, "n_heads": 4}


def _id(value: object) -> str:
    """A test id that is the same in every process (xdist's workers compare them): no memory address."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))



def _raises_one_memlab_error(make, field: str) -> str:
    with pytest.raises(MemlabError) as err:
        make()
    message = str(err.value)
    assert field in message, f"the message must name {field!r}: {message}"
    assert "\n" not in message and len(message) < 600, "one short line, whatever the input"
    return message


# -- TransformerConfig ------------------------------------------------------------------------------------------
CONFIG_BAD = [
    ("d_model", None), ("d_model", "64"), ("d_model", 64.0), ("d_model", True), ("d_model", 0), ("d_model", 10**7),
    ("n_layers", 10**9), ("n_layers", -1), ("n_layers", 2.5), ("n_heads", False), ("n_kv_heads", "2"),
    ("n_kv_heads", 0), ("d_ff", 1.5), ("d_ff", 10**8), ("vocab_size", np.nan), ("vocab_size", 10**9),
    ("max_seq", 10**200), ("max_seq", "1024"), ("mlp", "relu"), ("mlp", None), ("positions", 1), ("norm", "RMS"),
    ("bias", "yes"), ("bias", 1), ("tied_embeddings", "no"), ("tied_embeddings", None), ("dropout", "0.1"),
    ("dropout", 1.0), ("dropout", -0.1), ("dropout", math.inf), ("dropout", True), ("name", None), ("name", 3),
]


@pytest.mark.parametrize(("field", "value"), CONFIG_BAD, ids=[f"{f}={_id(v)}"[:40] for f, v in CONFIG_BAD])
def test_transformer_config_rejects(field: str, value: object) -> None:
    _raises_one_memlab_error(lambda: TransformerConfig(**{**DIMS, field: value}), field)


def test_tied_embeddings_no_is_refused_not_read_as_true() -> None:
    msg = _raises_one_memlab_error(lambda: TransformerConfig(**DIMS, tied_embeddings="no"), "tied_embeddings")
    assert "True or False" in msg


def test_size_limits_say_the_limit_and_the_reason() -> None:
    msg = _raises_one_memlab_error(lambda: TransformerConfig(d_model=64, n_layers=10**6, n_heads=4), "n_layers")
    assert "10,000" in msg and "DeepNet" in msg


# -- Setup ------------------------------------------------------------------------------------------------------
SETUP_BAD = [
    ("batch", 0), ("batch", True), ("batch", 2.0), ("batch", "4"), ("batch", 10**8), ("seq", 10**9), ("seq", None),
    ("mode", "training"), ("mode", None), ("precision", None), ("precision", 16), ("precision", "fp64"),
    ("optimizer", None), ("optimizer", "adamx"), ("recompute", True), ("attention", "flash2"),
    ("zero_stage", True), ("zero_stage", 1.0), ("zero_stage", 4), ("zero_stage", "3"), ("world_size", 0),
    ("world_size", 10**7), ("tp", 1.0), ("tp", 10**5), ("sp", 1), ("sp", "false"), ("inference_weights", "fp64"),
    ("inference_weights", None), ("kv_cache_dtype", "int4"),
]


@pytest.mark.parametrize(("field", "value"), SETUP_BAD, ids=[f"{f}={_id(v)}"[:40] for f, v in SETUP_BAD])
def test_setup_rejects(field: str, value: object) -> None:
    name = {"precision": "precision", "optimizer": "optimizer"}.get(field, field)
    _raises_one_memlab_error(lambda: Setup(**{field: value}), name)


def _string_choices(cls: type) -> list[tuple[str, str]]:
    return [(r.name, c) for r in field_rules(cls) for c in (r.choices or ()) if isinstance(c, str)]


@pytest.mark.parametrize("spell", [str.upper, lambda c: f" {c.title()}\t"], ids=["upper", "title-spaced"])
def test_every_string_choice_is_read_in_any_case_and_stored_canonically(spell) -> None:
    for field, choice in _string_choices(Setup):
        extra = {"tp": 2} if field == "sp" else {}
        if field == "optimizer_impl" and choice == "fused":
            extra["optimizer"] = "adamw"
        if field == "fsdp_param_dtype" and choice != "none":
            extra.update(zero_stage=3, world_size=2)  # FSDP2's MixedPrecisionPolicy needs FSDP2
        if field == "finetune" and choice == "qlora":
            extra["precision"] = "bf16"  # QLoRA computes in bf16 (any other precision is refused)
        if field == "finetune" and choice == "frozen":
            extra["frozen_layers"] = 1  # a frozen fine-tune names how many blocks it freezes
        if field == "lora_dtype" and choice != "fp32":
            extra["finetune"] = "lora"  # the adapters' dtype, of a LoRA fine-tune
        if field == "padding_side" and choice == "left":
            extra.update(attention_mask="padded", pad_fraction=0.25)  # a side only of a padded batch
        if field == "pp_schedule" and choice == "interleaved":
            extra.update(pp=2, pp_chunks=2)  # the interleaved schedule runs several model chunks per rank
        if field == "fsdp_output_dtype" and choice != "none":  # read, then refused with its reason
            with pytest.raises(SetupError, match="output_dtype casts every unit's forward output"):
                estimate(preset("tiny-gpt"), Setup(**{field: spell(choice)}, zero_stage=3, world_size=2))
            continue
        assert getattr(Setup(**{field: spell(choice)}, **extra), field) == choice
        assert Setup(**{field: spell(choice)}, **extra) == Setup(**{field: choice}, **extra)
    for field, choice in _string_choices(TransformerConfig):
        assert getattr(TransformerConfig(**DIMS, **{field: spell(choice)}), field) == choice
    for field, choice in _string_choices(Implementation):
        assert getattr(Implementation(**{field: spell(choice)}), field) == choice


def test_choice_arguments_follow_the_same_rule() -> None:
    from memlab.predict.memory.inference import kv_cache_bytes

    assert gpu("h100-sxm").peak(" BF16") == gpu("h100-sxm").peak("bf16")
    assert flops.mfu(7e9, 1e3, accelerator="h100-sxm", dtype="FP8") == flops.mfu(7e9, 1e3, accelerator="h100-sxm",
                                                                                dtype="fp8")
    assert flops.megatron_iteration_flops(TINY, 1, 8, "Full") == flops.megatron_iteration_flops(TINY, 1, 8, "full")
    assert kv_cache_bytes(TINY, 1, 8, "BF16", 1) == kv_cache_bytes(TINY, 1, 8, "bf16", 1)
    with pytest.raises(MemlabError, match=r"FP64.*Closest: fp32"):
        Setup(precision="FP64")  # a spelling of no choice is still refused, with the closest names


def test_setup_with_revalidates() -> None:
    with pytest.raises(MemlabError, match="zero_stage"):
        Setup().with_(zero_stage=True)


def test_every_setup_field_has_a_rule_so_new_fields_are_validated_by_their_annotation() -> None:
    rules = {r.name: r for r in field_rules(Setup)}
    assert set(rules) == {f.name for f in dataclasses.fields(Setup)}
    assert all(r.kind != "other" for r in rules.values()), "a Setup field of a type validate does not check"


def test_a_new_annotated_field_is_checked_without_new_code() -> None:
    @dataclasses.dataclass(frozen=True)
    class Later:
        steps: int = dataclasses.field(default=1, metadata={"max": 64, "why": "a test bound"})
        impl: Literal["foreach", "fused"] = "foreach"
        scale: float = 0.5
        flag: bool = False
        label: str | None = None

        def __post_init__(self) -> None:
            check_fields(self)

    Later()
    for bad in ({"steps": 65}, {"steps": True}, {"impl": "loop"}, {"scale": "0.5"}, {"flag": 0}, {"label": 1}):
        with pytest.raises(MemlabError, match=next(iter(bad))):
            Later(**bad)
    with pytest.raises(MemlabError, match="a test bound"):
        Later(steps=65)


@pytest.mark.parametrize(("make", "word"), [
    (lambda: Setup(batchsize=4), "did you mean batch"), (lambda: Setup(4), "keyword arguments only"),
    (lambda: TransformerConfig(), "needs d_model, n_layers, n_heads"),
    (lambda: TransformerConfig(**DIMS, n_layer=2), "did you mean n_layers"),
    (lambda: Overheads(cuda_context=1), "did you mean cuda_context_bytes"),
    (lambda: Overheads(1, 2, 0.0, 0, 5), "at most"),
    (lambda: Accelerator(**ROW, peak=1e12), "has no field"), (lambda: TINY.with_(layers=3), "did you mean n_layers"),
    (lambda: Implementation(fused=True), "did you mean fused_qkv"),
    (lambda: Numeric("n", "q", reference=lambda: 1, hint="", tolerance=0.1), "has no field"),
], ids=["setup-unknown", "setup-positional", "config-missing", "config-unknown", "overheads-unknown",
        "overheads-too-many", "accelerator-unknown", "with-unknown", "implementation-unknown", "numeric-unknown"])
def test_unknown_missing_or_positional_fields_are_memlab_errors(make, word: str) -> None:
    with pytest.raises(MemlabError, match=word):
        make()


def test_strict_dataclasses_still_copy_pickle_and_hash() -> None:
    import copy
    import pickle

    for obj in (TINY, Setup(batch=2), Overheads(workspace_bytes=5), gpu("h100-sxm")):
        assert copy.deepcopy(obj) == obj == pickle.loads(pickle.dumps(obj)) and hash(obj) == hash(copy.copy(obj))


# -- Overheads, presets, policies, GPUs ---------------------------------------------------------------------------
OVERHEADS_BAD = [
    ("fragmentation_fraction", "0.5"), ("fragmentation_fraction", 1.0), ("fragmentation_fraction", np.nan),
    ("fragmentation_fraction", True), ("cuda_context_bytes", 1e308), ("cuda_context_bytes", -1),
    ("cuda_context_bytes", 2**60), ("workspace_bytes", "1"), ("gathered_layers", True), ("gathered_layers", 10**6),
    ("fragmentation_fraction", 10**400), ("cuda_context_bytes", 10**400),
]


@pytest.mark.parametrize(("field", "value"), OVERHEADS_BAD, ids=[f"{f}={_id(v)}"[:40] for f, v in OVERHEADS_BAD])
def test_overheads_reject(field: str, value: object) -> None:
    _raises_one_memlab_error(lambda: Overheads(**{field: value}), field)


@pytest.mark.parametrize("call", [
    lambda: preset(None), lambda: preset(3), lambda: preset(""), lambda: preset("gpt5"),
    lambda: precision_policy(None), lambda: precision_policy(16), lambda: gpu(None), lambda: gpu(""),
    lambda: gpu(["h100"]),
], ids=["preset-None", "preset-3", "preset-empty", "preset-unknown", "policy-None", "policy-16", "gpu-None",
        "gpu-empty", "gpu-list"])
def test_name_lookups_reject_non_names(call) -> None:
    with pytest.raises(MemlabError):
        call()


ROW = {"key": "x", "name": "X", "vendor": "v", "memory_bytes": 2**30, "bandwidth_bytes_per_s": 1e12,
       "peak_flops": {"bf16": 1e14}, "form_factor": "SXM", "source": "s"}
ACCEL_BAD = [
    ("memory_bytes", True), ("memory_bytes", 1.5e9), ("memory_bytes", 0), ("memory_bytes", 2**60),
    ("bandwidth_bytes_per_s", "3e12"), ("bandwidth_bytes_per_s", -1.0), ("bandwidth_bytes_per_s", math.inf),
    ("peak_flops", {"bf16": 1e30}), ("peak_flops", {"bf16": "1e14"}), ("peak_flops", {"bf16": True}),
    ("peak_flops", {"fp64": 1e12}), ("peak_flops", [1e14]), ("unofficial", "no"), ("key", None),
    ("printed_sparse_flops", 7), ("printed_sparse_flops", "bf16"), ("printed_sparse_flops", {"bf16": 10**400}),
    ("printed_sparse_flops", {"fp64": 1e12}), ("printed_sparse_flops", {"bf16": True}),
]


@pytest.mark.parametrize(("field", "value"), ACCEL_BAD, ids=[f"{f}={_id(v)}"[:40] for f, v in ACCEL_BAD])
def test_accelerator_rows_reject(field: str, value: object) -> None:
    with pytest.raises(MemlabError):
        Accelerator(**{**ROW, field: value})


@pytest.mark.parametrize("call", [
    lambda: flops.flops_per_token(TINY, 10**400), lambda: flops.forward_flops(TINY, 10**400, 8),
    lambda: flops.step_time_to_tokens_per_second(1.0, 1, 10**400),
    lambda: flops.megatron_closed_form(1, 8, 10**400, 64, 100),
    lambda: gpu("h100-sxm").peak(None), lambda: gpu("h100-sxm").sparse_peak(None), lambda: gpu("h100-sxm").peak(16),
    lambda: resolve("NVIDIA H100 80GB HBM3", "80"), lambda: resolve("NVIDIA H100 80GB HBM3", [110]),
    lambda: resolve("NVIDIA H100 80GB HBM3", 80.0 * 2**30),
    lambda: resolve("AMD Instinct MI250X/MI250", multiprocessor_count=[110]),
], ids=["flops_per_token-huge-seq", "forward_flops-huge-batch", "tokens_per_second-huge-seq",
        "megatron-huge-layers", "peak-None", "sparse_peak-None", "peak-16", "resolve-memory-str",
        "resolve-memory-list", "resolve-memory-float", "resolve-cus-list"])
def test_odd_arguments_are_memlab_errors_not_python_ones(call) -> None:
    with pytest.raises(MemlabError) as err:
        call()
    assert "\n" not in str(err.value) and len(str(err.value)) < 600


def test_resolve_still_matches_a_real_device() -> None:
    assert resolve("NVIDIA H100 80GB HBM3", 80 * 2**30 - 2**28).key == "h100-sxm"
    assert resolve("AMD Instinct MI250X/MI250", multiprocessor_count=110).key == "mi250x"


@pytest.mark.parametrize("memory", [0, -1, 1.5e9, None, "80GB"], ids=repr)
def test_fits_refuses_a_device_without_a_usable_memory(memory: object) -> None:
    from memlab.predict.fit import fits, max_batch
    from memlab.predict.hardware.gpus import DeviceInfo

    dev = DeviceInfo(kind="cpu", name="odd host", accelerator=None, total_memory_bytes=memory, peak_flops={},
                     peak_source="unknown", peak_reason="test", torch_version=None, cuda_version=None,
                     driver_version=None, cpu_count=1)
    for call in (lambda: fits(estimate(TINY, Setup(seq=8)), dev), lambda: max_batch(TINY, Setup(seq=8), dev)):
        with pytest.raises(SetupError, match="memory"):
            call()


# -- estimate, sweep_totals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [True, 0, -5, 7.5e9, "7e9", None, 10**16], ids=repr)
def test_estimate_rejects_models_that_are_not_configs_or_counts(model: object) -> None:
    with pytest.raises(MemlabError):
        estimate(model, Setup())  # type: ignore[arg-type]


def test_estimate_rejects_a_setup_that_is_not_one() -> None:
    with pytest.raises(MemlabError, match="setup must be"):
        estimate(TINY, {"batch": 1})  # type: ignore[arg-type]


SWEEP_BAD = [
    ({"batch": np.nan}, "batch"), ({"batch": math.inf}, "batch"), ({"seq": [8, np.nan]}, "seq"),
    ({"batch": 0}, "batch"), ({"batch": 1.5}, "batch"), ({"batch": "4"}, "batch"), ({"batch": [True]}, "batch"),
    ({"batch": []}, "batch"), ({"batch": 10**8}, "batch"), ({"seq": 10**9}, "seq"),
    ({"batch": [1, 2], "seq": [8, 16, 32]}, "broadcast"), ({"batch": object()}, "batch"),
]


@pytest.mark.parametrize(("kwargs", "field"), SWEEP_BAD, ids=[_id(k)[:40] for k, _ in SWEEP_BAD])
def test_sweep_totals_rejects(kwargs: dict, field: str) -> None:
    _raises_one_memlab_error(lambda: sweep_totals(TINY, Setup(seq=8), **kwargs), field)


def test_sweep_totals_still_matches_estimate() -> None:
    totals = sweep_totals(TINY, Setup(seq=8), batch=np.array([1, 2, 4]))
    assert [round(t) for t in totals] == [estimate(TINY, Setup(seq=8, batch=b)).total_bytes for b in (1, 2, 4)]


# -- mfu ----------------------------------------------------------------------------------------------------------
MFU_BAD = [
    ({"tokens_per_second": math.nan}, "tokens_per_second"), ({"tokens_per_second": math.inf}, "tokens_per_second"),
    ({"tokens_per_second": 1e308}, "tokens_per_second"), ({"tokens_per_second": "1000"}, "tokens_per_second"),
    ({"tokens_per_second": True}, "tokens_per_second"), ({"num_devices": 0}, "num_devices"),
    ({"num_devices": 2.0}, "num_devices"), ({"num_devices": True}, "num_devices"), ({"dtype": "fp64"}, "dtype"),
    ({"recompute": "all"}, "recompute"), ({"model": True}, "model"), ({"model": 1e300}, "parameter count"),
    ({"model": TINY, "seq": None}, "seq"), ({"model": TINY, "seq": 4096}, "max_seq"),
    ({"model": TINY, "seq": 8.0}, "seq"), ({"accelerator": 3}, "accelerator"),
    ({"model_flops_per_token": math.inf}, "model_flops_per_token"),
]


@pytest.mark.parametrize(("kwargs", "field"), MFU_BAD, ids=[str(k)[:40] for k, _ in MFU_BAD])
def test_mfu_rejects(kwargs: dict, field: str) -> None:
    args = {"model": 7e9, "tokens_per_second": 1000.0, "accelerator": "h100-sxm", **kwargs}
    model, tps = args.pop("model"), args.pop("tokens_per_second")
    _raises_one_memlab_error(lambda: flops.mfu(model, tps, **args), field)


@pytest.mark.parametrize(("tps", "num_devices"), [(1e12, 1), (1e5, 1), (8 * 3e4, 1)])
def test_an_mfu_above_the_peak_is_an_explicit_implausible_verdict(tps: float, num_devices: int) -> None:
    res = flops.mfu(7e9, tps, accelerator="h100-sxm", num_devices=num_devices)
    assert res.computed_mfu > 1
    assert res.verdict == "implausible" and res.mfu is None and res.hfu is None and not res.known
    assert res.reason.startswith("implausible") and "global batch" in res.reason and "sparse" in res.reason
    assert json.dumps(res.to_dict(), allow_nan=False)


def test_a_plausible_mfu_is_unchanged() -> None:
    res = flops.mfu(7e9, 1e4, accelerator="h100-sxm")
    assert res.verdict == "ok" and res.mfu == pytest.approx(6 * 7e9 * 1e4 / gpu("h100-sxm").peak("bf16"))
    assert res.computed_mfu == res.mfu


def test_an_unknown_peak_is_an_unknown_verdict() -> None:
    res = flops.mfu(7e9, 1e4, accelerator=None)
    assert res.verdict == "unknown" and res.mfu is None and res.reason.startswith("unknown peak")


def test_mfu_rejects_the_seq_estimate_rejects() -> None:
    with pytest.raises(MemlabError, match="max_seq") as a:
        flops.mfu(TINY, 100.0, accelerator="h100-sxm", seq=TINY.max_seq + 1)
    with pytest.raises(MemlabError, match="max_seq") as b:
        estimate(TINY, Setup(seq=TINY.max_seq + 1))
    assert str(a.value) == str(b.value)


# -- detect()'s cached CPU peak ------------------------------------------------------------------------------------
@pytest.mark.parametrize("peak", [1e30, math.inf, -1.0, "1e11", True, None])
def test_detect_distrusts_an_implausible_cached_cpu_peak(tmp_path, peak) -> None:
    import torch

    from memlab.measure import machine as device_mod
    from memlab.measure.cpu import cpu_model

    model = cpu_model()
    key = f"{model} | torch {torch.__version__} | {int(torch.get_num_threads())} threads"
    entry = {"peak_flops": {"fp32": peak}, "benchmark": "forged"}
    (tmp_path / device_mod.CPU_CACHE_FILE).write_text(json.dumps({"entries": {key: entry}}))
    info = device_mod.detect(measure_cpu_peak=False, cache_dir=tmp_path)
    if peak is None:  # a None peak is a valid "unsupported" entry, kept as such
        assert info.peak_flops["fp32"] is None
        return
    assert info.peak_flops["fp32"] is None and info.peak_source == "unknown"


# -- the other public functions: every odd value is a MemlabError (or a finite result), never a foreign exception --
def _public_calls():
    from memlab.predict.fit import fits, max_batch, max_seq
    from memlab.predict.memory import activations, inference

    s = Setup(seq=8)
    return {
        "fits(gpu)": lambda v: fits(estimate(TINY, s), v),
        "fits(what)": lambda v: fits(v, "h100-sxm", s),
        "fits(setup)": lambda v: fits(TINY, "h100-sxm", v),
        "max_batch(setup)": lambda v: max_batch(TINY, v, "h100-sxm"),
        "max_batch(limit)": lambda v: max_batch(TINY, s, "h100-sxm", limit=v),
        "max_seq(gpu)": lambda v: max_seq(TINY, s, v),
        "roofline_bound(intensity)": lambda v: flops.roofline_bound(v, 1e12, 1e9),
        "roofline_bound(peak)": lambda v: flops.roofline_bound(1.0, v, 1e9),
        "activation_bytes(config)": lambda v: activations.activation_bytes(v, s),
        "activation_bytes(setup)": lambda v: activations.activation_bytes(TINY, v),
        "kv_cache_bytes(batch)": lambda v: inference.kv_cache_bytes(TINY, v, 8, "bf16", 1),
        "kv_cache_bytes(dtype)": lambda v: inference.kv_cache_bytes(TINY, 1, 8, v, 1),
        "forward_flops(batch)": lambda v: flops.forward_flops(TINY, v, 8),
        "flops_per_token(seq)": lambda v: flops.flops_per_token(TINY, v),
        "step_time_to_tokens_per_second": lambda v: flops.step_time_to_tokens_per_second(v, 1, 8),
        "estimate(device_type)": lambda v: estimate(TINY, s, device_type=v),
        "estimate(overheads)": lambda v: estimate(TINY, s, overheads=v),
        "estimate(step_on_device)": lambda v: estimate(TINY, s, step_on_device=v),
        "with_(d_model)": lambda v: TINY.with_(d_model=v),
    }


ODD = [None, True, "x", "", -1, 0, 1.5, math.nan, math.inf, 10**30, [], {}, object()]
PUBLIC = [(name, v) for name in _public_calls() for v in ODD]


@pytest.mark.parametrize(("name", "value"), PUBLIC, ids=[f"{n}-{_id(v)}"[:50] for n, v in PUBLIC])
def test_public_functions_give_memlab_errors_or_finite_results(name: str, value: object) -> None:
    try:
        result = _public_calls()[name](value)
    except MemlabError as exc:
        assert "\n" not in str(exc)
        return
    if isinstance(result, float | np.ndarray):
        assert np.all(np.isfinite(result)), f"{name}({value!r}) returned {result}"


def test_setup_view_overrides_fields_and_derives_properties_on_the_view() -> None:
    base = Setup(batch=2, seq=8, precision="bf16", recompute="full")
    b = np.array([1, 4])
    view = SetupView(SetupView(base, recompute="none"), batch=b)
    assert view.recompute == "none" and view.precision == "bf16" and view.policy == base.policy
    assert (view.tokens == b * 8).all()
    with pytest.raises(SetupError, match="fields only"):
        SetupView(base, bach=3)
    with pytest.raises(AttributeError):
        view.batch = 3


# -- generated: random field values over every public dataclass ---------------------------------------------------
FUZZ_ODD = [None, True, False, 0, 1, 2, 3, -1, 7, 64, 10**6, 10**30, 10**400, 0.5, 1.0, -0.0, math.nan, math.inf,
            1e308, "", " ", "x", "FP32 ", " Flash", "SwiGLU", "bf16", "1", "x" * 1000, [], {}, (), [1],
            {"bf16": 1e14}, object(), np.int64(4), np.float64(0.5), b"fp32", 2**63, complex(1, 1)]
"""Odd field values: bounds, non-finite numbers, numbers in the wrong type, strings in odd spellings, containers."""


def _fuzzed_classes() -> dict[type, dict[str, object]]:
    """Every public dataclass that validates its input, with the fields it needs to exist."""
    from memlab.course.exercises import Choice

    return {Setup: {}, TransformerConfig: dict(DIMS), Implementation: {}, Overheads: {}, Accelerator: dict(ROW),
            Numeric: {"name": "n", "question": "q", "reference": lambda: 1.0, "hint": "h"},
            Choice: {"name": "c", "question": "q", "reference": lambda: "a", "hint": "h",
                     "options": {"a": "one", "b": "two"}}}


@pytest.mark.parametrize("cls", list(_fuzzed_classes()), ids=lambda c: c.__name__)
def test_random_field_values_are_a_memlab_error_or_a_valid_object(cls: type) -> None:
    import copy
    import pickle

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from memlab.course.exercises import Result

    required = _fuzzed_classes()[cls]
    names = [f.name for f in dataclasses.fields(cls)] + ["bogus_field"]
    values = st.sampled_from(FUZZ_ODD)

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.dictionaries(st.sampled_from(names), values, min_size=1, max_size=3), values)
    def check(changes: dict[str, object], answer: object) -> None:
        try:
            obj = cls(**{**required, **changes})
        except MemlabError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 2000
            return
        if hasattr(obj, "check"):  # an exercise: a learner's answer never raises
            assert isinstance(obj.check(answer), Result)
            return
        assert pickle.loads(pickle.dumps(obj)) == obj == copy.deepcopy(obj)
        if isinstance(obj, Setup):  # a valid Setup estimates, or says why not
            try:
                total = estimate(TINY, obj.with_(seq=min(obj.seq, TINY.max_seq))).total_bytes
            except MemlabError:
                return
            assert isinstance(total, int) and total > 0

    check()
