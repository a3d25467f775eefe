"""memlab: predict, run, measure and compare how deep-learning training and inference use memory and compute.

The package is laid out in the order of the flow, one room per step::

    predict/   the formulas, no torch: models, setup, precision, activations, estimate, fit, flops, hardware, ...
    run/       torch code that executes a step: the reference GPT, training step, runner, sweeps, benchmarks, ...
    measure/   what is really there: byte accounting, live bytes, CUDA allocator, NVML, host, timelines, OOM, ...
    compare/   prediction next to measurement: the ledger and its plots
    course/    chapters, exercises, the papermill report and its pages, provenance
    cli/       the ``memlab`` command, one module per subcommand

Each room's ``__init__`` docstring lists its modules and what each holds.

``predict`` imports no torch; ``measure`` and ``run`` never import ``course``; the tests enforce both. The names a
notebook needs are re-exported here and imported lazily, so ``import memlab`` stays light::

    from memlab import Setup, estimate, preset, run_step
    from memlab.compare import compare      # the room and its main function share a name

    setup = Setup(batch=2, seq=64)
    compare(estimate(preset("tiny-gpt"), setup), run_step(preset("tiny-gpt"), setup, device="cpu"))
"""

from __future__ import annotations

import importlib
from typing import Any

from memlab.errors import ConfigError as ConfigError
from memlab.errors import MemlabError as MemlabError
from memlab.errors import SetupError as SetupError
from memlab.errors import UnknownNameError as UnknownNameError

_EXPORTS: dict[str, tuple[str, ...]] = {
    "memlab.predict.models": ("TransformerConfig", "preset", "preset_names"),
    "memlab.predict.setup": ("Setup",),
    "memlab.predict.precision": ("PRECISION_POLICIES", "precision_policy"),
    "memlab.predict.estimate": ("MemoryBreakdown", "Overheads", "estimate", "sweep_totals"),
    "memlab.predict.activations": ("activation_bytes",),
    "memlab.predict.fit": ("fits", "max_batch", "max_seq"),
    "memlab.predict.flops": ("forward_flops", "flops_per_token", "matmul_flops", "megatron_closed_form",
                             "megatron_iteration_flops", "mfu", "roofline_bound"),
    "memlab.predict.attention_io": ("attention_hbm_bytes",),
    "memlab.predict.parallelism": ("cluster_utilisation", "exposed_comm_for", "pipeline_bubble_fraction"),
    "memlab.predict.inference": ("kv_cache_bytes",),
    "memlab.predict.paging": ("kv_waste", "max_sequences", "reserved_tokens", "synthetic_request_lengths"),
    "memlab.predict.sharding": ("shape_summary",),
    "memlab.predict.hf": ("from_hf", "reference_activation_bytes", "trait_effects"),
    "memlab.predict.hardware": ("gpu", "list_gpus"),
    "memlab.device": ("resolve_device", "resolve_scale"),
    "memlab.model.gpt": ("GPT", "available_attention"),
    "memlab.model.step": ("token_ids",),
    "memlab.model.hf": ("build_hf_model",),
    "memlab.measure.machine": ("detect",),
    "memlab.measure.accounting": ("model_states",),
    "memlab.measure.by_op": ("layer_listing", "saved_by_op"),
    "memlab.run.runner": ("Measurement", "count_flops", "run_step"),
    "memlab.run.sweep": ("sweep",),
    "memlab.tracing.tracer": ("Trace", "trace"),
    "memlab.tracing.gpt": ("trace_gpt",),
    "memlab.tracing.hf": ("trace_hf",),
    "memlab.labs.step_time": ("training_loop",),
    "memlab.compare.ledger": ("compare_trace", "ledger"),
    "memlab.course.chapter": ("chapter",),
    "memlab.course.exercises": ("Choice", "Numeric"),
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
