"""The calculator shoot-out: every public memory estimator asked about the same runs, next to what was measured.

One function per estimator takes a :class:`Run` (an HF config, batch, seq, dtype, recipe, attention, recompute) and
returns a :class:`~memlab.compare.scoring.CalculatorResult` with its prediction per component it claims: model
``states`` (parameters + gradients + optimizer), ``activations`` (saved for backward), their sum, the ``peak``; a
component it does not claim on that run (it models no such term, or the run's recipe is not the one it assumes) is
out of scope, with the reason. Where an estimator has code, its own code is called; where it is a formula
(:mod:`memlab.studies.formulas`), the formula is written from its source:

- ``accelerate``: ``accelerate estimate-memory``'s own functions (``accelerate.commands.estimate``:
  ``calculate_maximum_sizes`` on an empty model, ``estimate_training_usage``; the command reports the largest of
  its terms as "Training using Adam") ``[accelerate-estimate]``;
- ``deepspeed-zero2`` / ``deepspeed-zero3``: ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` (one GPU, no offload; ZeRO-3's largest layer found as DeepSpeed's
  ``model_to_params`` does) ``[deepspeed-zero]``;
- ``gpu_poor``: ``src/App.js`` of RahulSChand/gpu_poor (its own parameter formula, 2-byte floats, Adam as
  3 x the model, ``getActivationMemory``; its fixed 650 MB "cuda + other overhead" is left out) ``[gpu-poor]``;
- ``transformer-math-101 / ultrascale-playbook`` (:data:`KORTHIKANTI`): EleutherAI's Transformer Math 101 and the
  Ultra-Scale Playbook print one formula, so they are one row: 16 B/param with AdamW and Korthikanti et al.'s
  activations in the form the run's kernel and recompute call for ``[anthony2023]`` ``[tazi2025]``;
- ``memlab``: :func:`memlab.predict.families.reader.from_hf` and the term-by-term activation model;
- ``memlab-trace``: :func:`memlab.tracing.hf.trace_hf`, the real Hugging Face model's step traced on fake tensors
  (MemTracker counts every storage; nothing is allocated, so full-size configs run on a laptop's CPU)
  ``[pytorch-memtracker]``.

Formulas given a parameter count get the model's exact one (their own count formulas assume the GPT-2 layout), so
the comparison is of bytes per parameter and per token, not of parameter counting. An estimator whose package cannot
be imported on this machine returns ``available=False`` with the reason; its rows are skipped, never imitated. A
fine-tuning run (``Run.finetune`` ``lora`` or ``qlora``) is scored only on what each tool claims for it: gpu_poor's
LoRA and QLoRA modes on 16-bit runs; accelerate has no LoRA mode and is given no claim; the tools that model full
training only give no number. A per-layer activation formula (:data:`PER_LAYER_TOOLS`) is scored on the blocks'
bytes only (:func:`block_activation_bytes`). The ground truth is a real step measured here
(:func:`memlab.run.hf.measure_run`) or, at full size, the fake-tensor trace of the real HF code
(:func:`traced_truth`); :mod:`memlab.compare.scoring` turns the long table into signed errors and scopes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from memlab.compare.ledger import rel_error
from memlab.compare.scoring import (  # noqa: F401 - re-exported: the scoring tables
    COMPONENTS,
    OUT_OF_SCOPE,
    TRAITS_WRITTEN_FROM,
    CalculatorResult,
    error_table,
    held_out_table,
    scope_table,
    scoped,
)
from memlab.errors import MemlabError
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.activations import activation_bytes
from memlab.run.spec import Run
from memlab.studies.formulas import (  # noqa: F401 - re-exported: the formula tools
    GPU_POOR_APP,
    KORTHIKANTI,
    gpu_poor,
    korthikanti_guides,
    korthikanti_variant,
    transformer_math_101,
    ultrascale_playbook,
)

if TYPE_CHECKING:
    import pandas as pd

    from memlab.tracing.tracer import Trace

def _unavailable(tool: str, reason: str) -> CalculatorResult:
    return CalculatorResult(tool, None, None, available=False, note=reason)


def _params(run: Run) -> int:
    return from_hf(run.hf).param_count()


@functools.lru_cache(maxsize=64)
def _empty_model_sizes(hf_items: tuple, base: bool) -> tuple[int, int, int]:
    """(accelerate total_size, DeepSpeed total_params, DeepSpeed largest_layer_params) of an empty fp32 model:
    ``AutoModel`` (the base model, no LM head) when ``base``, as ``accelerate estimate-memory`` builds it
    (``create_empty_model``), else ``AutoModelForCausalLM``, the model one trains and hands DeepSpeed."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModel, AutoModelForCausalLM

    from memlab.model.hf import hf_config

    with init_empty_weights():
        model = (AutoModel if base else AutoModelForCausalLM).from_config(hf_config(dict(hf_items)),
                                                                          dtype=torch.float32)
    total_size, _ = calculate_maximum_sizes(model)
    total_params = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return int(total_size), int(total_params), int(largest)


def _hf_key(run: Run) -> tuple:
    return tuple(sorted((k, v) for k, v in run.hf.items() if not isinstance(v, dict | list)))


def accelerate_estimate(run: Run) -> CalculatorResult:
    """``accelerate estimate-memory``: its "Training using Adam" figure, the largest of the terms of
    ``estimate_training_usage(total_size, dtype)`` ("how much training memory is needed for a batch size of 1")
    for the empty ``AutoModel``'s ``total_size`` (fp32 bytes, buffers included, no LM head: the command builds the
    base model). The largest of its phase terms is a peak, so it is scored on the peak; its recipes are
    ``float32`` (an fp32 run) and ``float16``/``bfloat16``, which its own comment describes as weights "stored in
    FP16 and FP32" (mixed precision): a pure bf16 run is out of scope. No activations. ``[accelerate-estimate]``"""
    try:
        from accelerate.commands.estimate import estimate_training_usage
    except ImportError as exc:  # pragma: no cover - accelerate is a course dependency
        return _unavailable("accelerate", f"accelerate cannot be imported here: {exc}")
    total_size, _, _ = _empty_model_sizes(_hf_key(run), True)
    usage = estimate_training_usage(total_size, "float32" if run.dtype == "fp32" else "bfloat16")
    if run.finetune != "full":  # it has no LoRA or QLoRA mode: no claim is put in its mouth
        return CalculatorResult("accelerate", None, None,
            note=f"no {run.finetune} mode: it estimates loading and full training only")
    reasons = {"states": "one figure, the largest of its terms (a peak), not the states",
               "activations": "no activation model"}
    if run.recipe == "bf16":
        reasons["peak"] = "assumes fp32 master weights for a 16-bit model (mixed precision), not pure bf16"
        return scoped("accelerate", {}, reasons)
    return scoped("accelerate", {"peak": float(max(usage.values()))}, reasons,
                   note="largest of estimate_training_usage's terms, batch 1; no activation model")


def _quiet_deepspeed_accelerator() -> None:
    """Without CUDA, DeepSpeed's import logs a WARNING ("Setting accelerator to CPU ...") into the page; naming the
    CPU accelerator (``DS_ACCELERATOR``, deepspeed/accelerator/real_accelerator.py) selects it without the warning.
    Set only when unset and only on a machine without CUDA, so a user's choice and a GPU run are left alone."""
    import os

    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def _deepspeed(stage: int, run: Run) -> CalculatorResult:
    tool = f"deepspeed-zero{stage}"
    if run.finetune != "full":
        return CalculatorResult(tool, None, None, note="full training only (every parameter has states)")
    try:
        _quiet_deepspeed_accelerator()
        if stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as est
        else:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as est
    except Exception as exc:  # DeepSpeed can fail at import for many machine reasons (no compiler, no CUDA)
        return _unavailable(tool, f"DeepSpeed cannot be imported here ({type(exc).__name__}: {exc})")
    # total_params as DeepSpeed's model_to_params counts a live model (tied weights once, by data_ptr): the exact
    # count; an empty model's tied weights are separate meta tensors, so only the largest layer is taken from it.
    _, _, largest = _empty_model_sizes(_hf_key(run), False)
    total = _params(run)
    if stage == 2:
        _, gpu = est(total, num_gpus_per_node=1, num_nodes=1, cpu_offload=False)
    else:
        _, gpu, _ = est(total, largest, num_gpus_per_node=1, num_nodes=1, cpu_offload=False,
                        cpu_offload_params=False)
    reasons = {"activations": "no activation model (model states only)", "peak": "model states only"}
    if run.recipe != "mixed-bf16":
        reasons["states"] = ("assumes 16-bit weights and gradients with fp32 master and Adam states (mixed "
                             f"precision), not {run.recipe}")
        return scoped(tool, {}, reasons)
    return scoped(tool, {"states": float(gpu)}, reasons,
                   note="GPU bytes, one GPU, no offload; its 18 B/param are 2_grads_16bit + 4_grads_32bit + "
                        "4_params_32bit + 8_optimizer_states_32bit (stage_1_and_2.py): the fp32 gradient partition "
                        "is a term memlab's states leave out, not more optimizer state")


def deepspeed_zero2(run: Run) -> CalculatorResult:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs`` (2 + 18 B/param on one GPU). ``[deepspeed-zero]``"""
    return _deepspeed(2, run)


def deepspeed_zero3(run: Run) -> CalculatorResult:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (4 x largest layer + 18 B/param). ``[deepspeed-zero]``"""
    return _deepspeed(3, run)

def memlab_formula(run: Run) -> CalculatorResult:
    """memlab: :func:`~memlab.predict.families.reader.from_hf` traits, term-by-term activations, the estimator's
    model states."""
    cfg, setup = from_hf(run.hf), run.setup()
    bd = estimate(cfg, setup, device_type=run.device_type)
    comp = bd.components()
    acts = sum(activation_bytes(cfg, setup, device_type=run.device_type).values())
    return CalculatorResult("memlab", float(comp["params"] + comp["grads"] + comp["optimizer"]), float(acts),
                            peak=float(bd.peak_bytes), note="told the kernel path, device and dropout (Run.setup)")


@functools.lru_cache(maxsize=32)
def _trace(hf_items: tuple, batch: int, seq: int, dtype: str, attn: str, device_type: str,
           lora: tuple = ("full", 0, ""), recipe: tuple = ("", "none")) -> Trace:
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    run = Run(dict(hf_items), batch, seq, dtype, attn, device_type, finetune=lora[0], lora_rank=lora[1],
              lora_targets=lora[2], precision=recipe[0], recompute=recipe[1])
    return trace_hf(hf_config(run.hf), run.setup(), device_type=device_type, name=run.hf.get("model_type"))


def trace_run(run: Run) -> Trace:
    """The fake-tensor trace of ``run`` (:func:`memlab.tracing.hf.trace_hf` of its config under ``run.setup()``,
    on CPU, at any size; cached per run). ``[pytorch-memtracker]``"""
    return _trace(_hf_key(run), run.batch, run.seq, run.dtype, run.attn_implementation, run.device_type,
                  (run.finetune, run.lora_rank, run.lora_targets), (run.precision, run.recompute))


def trace_components(trace: Trace) -> dict[str, int]:
    """A trace's bytes as the shoot-out counts them (:meth:`memlab.tracing.tracer.Trace.components`): ``states`` =
    parameters + gradients + optimizer states (buffers left out, as the measurement leaves them); ``activations``
    = what the steady forward leaves alive (the measurement's saved-for-backward count has the input ids but not
    the labels nor the scalar loss: a few bytes per token less)."""
    c = trace.components()
    return {"states": c["params"] + c["grads"] + c["optimizer"], "activations": c["activations"]}


def memlab_trace(run: Run) -> CalculatorResult:
    """memlab's fake-tensor trace of the real Hugging Face model (:func:`trace_run`): model states and the bytes the
    forward leaves for backward (:func:`trace_components`), with the peak inside the step in the note. Unavailable,
    with the reason, when transformers cannot be imported or the setup cannot be traced on CPU.
    ``[pytorch-memtracker]``"""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a course dependency
        return _unavailable("memlab-trace", f"transformers cannot be imported here: {exc}")
    try:
        t = trace_run(run)
    except MemlabError as exc:  # e.g. the CPU flash kernel has no dropout: the trace cannot run this setup here
        return _unavailable("memlab-trace", str(exc))
    c = trace_components(t)
    return CalculatorResult("memlab-trace", float(c["states"]), float(c["activations"]), peak=float(t.peak_bytes),
                            note=f"fake tensors, CPU; peak {t.peak_bytes:,} B in the {t.peak_step} {t.peak_phase}",
                            out_of_scope=(("peak", "no peak measured on this machine to compare with"),))


BLOCK = re.compile(r"\.(?:h|layers|layer|blocks)\.\d+$")
"""A transformer block's module name in a Hugging Face model (``transformer.h.0``, ``model.layers.3``)."""


def block_activation_bytes(trace: Trace) -> int:
    """What the transformer blocks' forwards leave for backward, summed over the blocks
    (:attr:`memlab.tracing.tracer.Trace.modules`, MemTracker's post- minus pre-forward activations of each ``BLOCK``
    module): the truth a per-layer activation
    formula is scored on, without the embeddings, the final norm, the head and the loss, which such a formula
    leaves out by definition. Each block's output is counted once, as a per-layer formula counts a layer's input,
    even where the next block keeps an fp32 copy of it instead (Llama's RMSNorm upcast), so the sum can exceed what
    the whole forward leaves alive. Bytes."""
    return sum(m["activation_bytes"] for m in trace.modules if BLOCK.search(m["module"]))


def traced_truth(run: Run) -> dict[str, int | str]:
    """The ground truth of a full-size run: the fake-tensor trace of the real Hugging Face modelling code
    (:func:`trace_run`): ``states``, ``activations`` (:func:`trace_components`), ``per_layer`` (the blocks' share
    of the activations, :func:`block_activation_bytes`), ``peak`` (the largest phase peak of both steps) and
    ``peak_in`` (its step and phase). Evidence from outside memlab's formula: the real HF code,
    PyTorch's kernels' saved tensors and MemTracker; CPU kernels, no CUDA allocator. ``[pytorch-memtracker]``"""
    t = trace_run(run)
    return {**trace_components(t), "per_layer": block_activation_bytes(t), "peak": t.peak_bytes,
            "peak_in": f"{t.peak_step} {t.peak_phase}"}


CALCULATORS: dict[str, Callable[[Run], CalculatorResult]] = {
    "memlab": memlab_formula,
    "memlab-trace": memlab_trace,
    "accelerate": accelerate_estimate,
    "deepspeed-zero2": deepspeed_zero2,
    "deepspeed-zero3": deepspeed_zero3,
    "gpu_poor": gpu_poor,
    KORTHIKANTI: korthikanti_guides,
}
"""Every calculator, by name, in table order (one row per formula: Transformer Math 101 and the Playbook share
one, :data:`KORTHIKANTI`)."""

PEERS = ("accelerate", "deepspeed-zero2", "deepspeed-zero3", "gpu_poor", KORTHIKANTI)
"""The public calculators scored against a ground truth (memlab's own rows are shown beside them)."""

PER_LAYER_TOOLS = (KORTHIKANTI,)
"""Tools whose activation formula is per transformer layer: scored on the truth's ``per_layer`` bytes (the blocks),
never charged for the embeddings, head and loss; out of scope on a truth without them."""


def _truth_for(name: str, measured: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The truth ``name`` is scored on, and the reason when a per-layer tool has none (else "")."""
    meas = {**measured, "states + activations": measured["states"] + measured["activations"]}
    if name not in PER_LAYER_TOOLS:
        return meas, ""
    if "per_layer" not in measured:
        return meas, "a per-layer formula; this run's truth has no per-layer bytes"
    return {**meas, "activations": measured["per_layer"],
            "states + activations": measured["states"] + measured["per_layer"]}, ""


def shoot_out(runs: Iterable[tuple[Run, dict[str, Any]]], tools: Iterable[str] | None = None) -> pd.DataFrame:
    """Long table: one row per (tool, run, component the truth has) with predicted, measured, relative error and
    ``scope``: ``scored``, ``out of scope`` (the tool claims no number for it on this run: the reason is in
    ``note``) or ``unavailable``.

    ``runs`` pairs each :class:`Run` with its truth ``{"states": ..., "activations": ...}`` (bytes; ``"peak"``
    too where known): a real step (:func:`memlab.run.hf.measure_run`) or the full-size trace
    (:func:`traced_truth`); ``truth`` names which. An out-of-scope cell has no error: it is never scored.
    """
    import pandas as pd

    rows = []
    for run, measured in runs:
        truth = measured.get("truth", "measured" if "peak" not in measured else "traced")
        params = _params(run)
        for name in tools or CALCULATORS:
            r = CALCULATORS[name](run)
            meas, no_layer = _truth_for(name, measured)
            for comp in COMPONENTS:
                if comp not in meas:
                    continue
                p, m = r.claim(comp), meas[comp]
                if no_layer and comp in ("activations", "states + activations"):
                    p = None
                scope = "unavailable" if not r.available else ("scored" if p is not None else OUT_OF_SCOPE)
                rows.append({"tool": name, "experiment": run.label, "config": run.name or run.hf.get("model_type"),
                             "family": run.hf.get("model_type"), "parameters": params, "dtype": run.dtype,
                             "recipe": run.recipe,
                             "attention": run.attn_implementation, "recompute": run.recompute, "truth": truth,
                             "component": comp, "predicted": p, "measured": m,
                             "rel_error": rel_error(p, m) if p is not None else None, "available": r.available,
                             "scope": scope, "note": (no_layer or r.reason(comp)) if p is None else r.note})
    return pd.DataFrame(rows)

def full_size_runs(configs: dict[str, dict[str, Any]], grid: Iterable[tuple[str, str, str, str]], seq: int, *,
                   device_type: str = "cpu") -> list[Run]:
    """The full-size shoot-out grid: one batch-1 :class:`Run` per ``(config name, attn_implementation, recompute,
    precision)`` of ``grid`` (precision ``mixed-bf16`` or ``""`` for pure bf16, on a bf16 model; ``amp-bf16``, HF
    Trainer's autocast, on an fp32 model), at
    ``seq`` tokens, or the config's context (or one below its sliding window) where shorter
    (:meth:`~memlab.predict.spec.model.TransformerConfig.modelled_seq`). ``device_type`` "cpu" (the default) asks every
    tool about the kernels the trace runs (:func:`traced_truth` traces on this CPU): like for like."""
    return [Run(configs[n], 1, from_hf(configs[n]).modelled_seq(seq), "fp32" if prec == "amp-bf16" else "bf16", attn,
                device_type=device_type, name=n, precision=prec, recompute=rc) for n, attn, rc, prec in grid]

# -- fine-tuning: the tools that claim something for a LoRA run, scored on that only ----------------------------
FINETUNE_TOOLS = ("memlab", "gpu_poor", "accelerate")
"""The calculators shown for a LoRA fine-tune: memlab, gpu_poor's LoRA mode (16-bit runs only) and accelerate, which
has no LoRA mode and so claims nothing (:func:`finetune_scope` shows each one's claim)."""


def lora_runs(configs: dict[str, dict[str, Any]], batch: int, seq: int, *, lora_rank: int, dtype: str = "fp32",
              attn_implementation: str = "eager", device_type: str = "cpu") -> list[Run]:
    """One LoRA :class:`Run` (peft's default targets, ``lora_rank``) per named HF config, at ``batch`` x ``seq``."""
    return [Run(cfg, batch, seq, dtype, attn_implementation, device_type, name=name, finetune="lora",
                lora_rank=lora_rank) for name, cfg in configs.items()]


def finetune_shoot_out(runs: Iterable[Run], measured: dict[Run, dict[str, int]] | None = None, *, seed: int = 0,
                       tools: Iterable[str] = FINETUNE_TOOLS) -> pd.DataFrame:
    """:func:`shoot_out` over fine-tuning runs: each run's measurement from ``measured`` (``{"states",
    "activations"}`` bytes), or, where absent, measured here with peft (:func:`memlab.run.hf.measure_run`)."""
    from memlab.run.hf import measure_run

    given = measured or {}
    return shoot_out([(run, given[run] if run in given else measure_run(run, seed=seed)) for run in runs],
                     tools=list(tools))


def finetune_scope(run: Run, tools: Iterable[str] | None = None) -> pd.DataFrame:
    """What each calculator claims for the fine-tuning ``run``: per tool, whether it gives a states and an
    activations number, and its own note. The scope, shown beside the errors; a component a tool does not claim is
    not scored (not an error)."""
    import pandas as pd

    rows = []
    for name in tools or CALCULATORS:
        r = CALCULATORS[name](run)
        rows.append({"tool": name, "states": "claimed" if r.states is not None else "not modelled",
                     "activations": "claimed" if r.activations is not None else "not modelled",
                     "available": r.available, "note": r.note})
    return pd.DataFrame(rows)

