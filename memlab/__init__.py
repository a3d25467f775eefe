"""memlab: predict, run, measure and compare how deep-learning training and inference use memory and compute.

One training step has three twins: the formula (``predict``), the step on fake tensors (``tracing``) and the step
on this machine (``run``); the last two stand on the torch model in ``model``. The rooms follow the flow
predict -> trace -> run -> measure -> compare -> studies -> report::

    room       holds                                                             may import
    predict/   the formulas, no torch: models, setup, precision, activations,    errors, units
               estimate, phases, fit, flops, hardware, sharding, inference
    model/     the torch twin of predict.spec.model: reference GPT (MoE, KV cache),  predict, device
               the training step, optimizers, HF models built from configs
    tracing/   twin 2, the step on fake tensors: trace, trace_gpt, trace_hf      model, predict, device
    run/       twin 3, the step here: run_step, live steps, sweeps, HF runs,     model, measure, predict, device
               op profile, distributed/ (torchrun ranks)
    measure/   meters: accounting, live bytes, CUDA allocator, NVML, host,       predict, device
               timelines, OOM, roofline, machine
    compare/   the ledger (formula, trace, measurement), scoring, verdicts,      predict, tracing, run, measure
               the one tolerance, plots
    studies/   campaigns judged by compare: calculator shoot-out, seeded draws,  compare, model, predict,
               the upgrade canary, parallel ranks and traces, torchtitan peer    tracing, run, measure
    labs/      one module per chapter topic (leaks, loss scaling, monitors)      all but course and cli
    course/    chapters, exercises, the papermill report, the book, provenance   all but cli
    cli/       the memlab command, one module per subcommand                     all
    device.py  the one device/scale/dtype resolver                               predict
    units.py   GB and GiB, formatting; errors.py: the one exception family       nothing

Every room may import ``errors`` and ``units``; imports inside functions count, and ``tests/test_layering.py``
enforces the table (and no import cycles). Each room's ``__init__`` docstring lists its modules. The names a
notebook needs are re-exported here and imported lazily, so ``import memlab`` stays light::

    from memlab import Setup, estimate, preset, resolve, run_step
    from memlab.compare import compare      # the room and its main function share a name

    setup = Setup(batch=2, seq=64)
    compare(estimate(preset("tiny-gpt"), setup), run_step(preset("tiny-gpt"), setup, device="cpu"))

A model has one name, the same here and on the command line (``memlab estimate --model SPEC``):
``resolve("ref:llama-2-7b")`` is the reference GPT with Llama-2-7B's sizes (``preset("llama-2-7b")``),
``resolve("llama-2-7b")`` (or ``"hf:llama-2-7b"``) the published model from the config memlab ships, and a path or
a cached Hugging Face model id its ``config.json`` (:mod:`memlab.predict.families.resolver`).
"""

from __future__ import annotations

import importlib
from typing import Any

from memlab.errors import ConfigError as ConfigError
from memlab.errors import MemlabError as MemlabError
from memlab.errors import SetupError as SetupError
from memlab.errors import UnknownNameError as UnknownNameError

_EXPORTS: dict[str, tuple[str, ...]] = {
    "memlab.predict.spec.model": ("TransformerConfig", "preset", "preset_names"),
    "memlab.predict.spec.setup": ("Setup",),
    "memlab.predict.spec.precision": ("PRECISION_POLICIES", "precision_policy"),
    "memlab.predict.estimate": ("MemoryBreakdown", "Overheads", "estimate", "sweep_totals"),
    "memlab.predict.memory.activations": ("activation_bytes", "reference_activation_bytes", "trait_effects"),
    "memlab.predict.memory.korthikanti": ("attention_score_share", "korthikanti_layer_bytes"),
    "memlab.predict.fit": ("fits", "max_batch", "max_seq", "serving_table"),
    "memlab.predict.compute.flops": ("decode_flops", "forward_flops", "flops_per_token", "matmul_flops",
                                     "megatron_closed_form", "megatron_iteration_flops", "mfu", "roofline_bound"),
    "memlab.predict.compute.attention_io": ("attention_hbm_bytes",),
    "memlab.predict.parallel.efficiency": ("cluster_utilisation", "exposed_comm_for", "pipeline_bubble_fraction"),
    "memlab.predict.parallel.communication": ("ring_wire_bytes", "zero_comm_bytes"),
    "memlab.predict.memory.inference": ("kv_cache_bytes",),
    "memlab.predict.paging": ("kv_waste", "max_sequences", "reserved_tokens", "synthetic_request_lengths",
                              "vllm_kv_blocks"),
    "memlab.predict.memory.sharding": ("shape_summary",),
    "memlab.predict.families.reader": ("from_hf",),
    "memlab.predict.families.resolver": ("published", "resolve"),
    "memlab.predict.hardware.gpus": ("gpu", "list_gpus"),
    "memlab.predict.gpu.alloc_conf": ("AllocatorConfig", "parse_alloc_conf"),
    "memlab.predict.gpu.replay": ("replay",),
    "memlab.device": ("resolve_device", "resolve_scale"),
    "memlab.model.gpt": ("GPT", "available_attention"),
    "memlab.model.step": ("token_ids",),
    "memlab.model.hf": ("build_hf_model",),
    "memlab.tracing.tracer": ("Trace", "trace"),
    "memlab.tracing.gpt": ("trace_gpt",),
    "memlab.tracing.hf": ("trace_hf",),
    "memlab.measure.machine": ("describe", "detect"),
    "memlab.measure.roofline": ("matmul_flops_per_s",),
    "memlab.measure.accounting": ("model_states",),
    "memlab.measure.by_op": ("layer_listing", "saved_by_op"),
    "memlab.measure.live_bytes": ("stacked_by_label",),
    "memlab.measure.cuda": ("emulate_smaller_gpu", "record_memory_history"),
    "memlab.measure.oom": ("parse_oom_message", "decode_oom"),
    "memlab.measure.oom_examples": ("RECORDED_OOM_MESSAGES",),
    "memlab.measure.snapshot": ("fragmentation_probe", "load_snapshot", "segment_check", "snapshot_allocation_log",
                                "snapshot_timeline"),
    "memlab.run.runner": ("Measurement", "count_flops", "run_step"),
    "memlab.run.sweep": ("measurement_of", "read_rows", "sweep"),
    "memlab.run.live_steps": ("live_training_steps",),
    "memlab.run.distributed.launch": ("WorkerSpec", "launch_sweep", "machine_capacity", "torchrun_command"),
    "memlab.compare.ledger": ("compare_trace", "ledger", "predict_for"),
    "memlab.compare.sharding": ("predicted_rank", "sharding_ledger"),
    "memlab.labs.step_time": ("training_loop",),
    "memlab.course.chapter": ("chapter",),
    "memlab.course.exercises": ("Choice", "Numeric"),
    "memlab.course.bank": ("check",),
    "memlab.course.hf_configs": ("config_names", "config_source", "load_config"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(["ConfigError", "MemlabError", "SetupError", "UnknownNameError", *_WHERE])
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'memlab' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
