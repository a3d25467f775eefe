"""The reference GPT's step on fake tensors: :func:`trace_gpt` (training under a Setup, or inference).

The step is wired by :mod:`memlab.model.step` exactly as the measured runner wires it (precision policy, master
weights, optimizer and its implementation), then traced by :func:`memlab.tracing.tracer.trace_step`. With
``zero_stage`` 2/3 over ``world_size`` > 1 ranks the blocks are sharded with FSDP2 over a fake process group
(:mod:`memlab.tracing.fake_dist`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup, resolve_optimizer_impl
from memlab.tracing.arguments import check_trace_setup
from memlab.tracing.tracer import PhaseRecorder, Trace, allocation_log, fast_mem_tracker, module_rows, trace_step


def setup_parts(setup: Setup, *, lr: float = 1e-4, device_type: str = "cuda") -> dict[str, Any]:
    """``step_fn`` and ``notes`` that carry out ``setup``'s precision policy, optimizer, ``zero_grad`` and gradient
    accumulation for :func:`~memlab.tracing.tracer.trace_step`: ``step_fn(model)`` is
    :func:`memlab.model.step.training_step`, the runner's wiring, with loss scaling left out (its finite check
    reads values a fake tensor lacks) and autocast to the CPU, where traces run.

    ``device_type`` is the device whose optimizer default (``optimizer_impl='auto'``) the trace imitates.
    """
    from memlab.model.optimizers import build_optimizer
    from memlab.model.step import TrainingStep, training_step

    check_trace_setup(setup, device_type)
    if setup.mode != "train":
        raise SetupError("this traces a training step: set mode='train' (trace_gpt traces inference itself)")
    if setup.tp > 1:
        raise SetupError("the tracer runs data parallelism only: set tp=1 (tensor-parallel traces are future work)")
    if setup.world_size > 1 and setup.zero_stage not in (2, 3):
        raise SetupError("a traced data-parallel setup runs FSDP2: set zero_stage=2 or 3 (plain DDP and ZeRO-1 "
                         "replicate the model: trace world_size=1)")
    policy, notes = setup.policy, []
    impl = resolve_optimizer_impl(setup.optimizer, setup.optimizer_impl, device_type)
    notes.append(f"optimizer {setup.optimizer}, {impl} implementation")
    if policy.grad_scaler:
        notes.append("loss scaling traced without its finite check (data-dependent on fake tensors): the scale and "
                     "found-inf scalars are a few bytes")

    if setup.offload_activations:
        notes.append("activation offload (save_on_cpu, pinned) simulated: saved tensors leave the device for a "
                     "meta-tensor 'host' and come back as fresh device tensors; device bytes are a GPU run's, "
                     "values are not; the trace's host_bytes is what a forward copies to the host")

    def step_fn(model: nn.Module) -> TrainingStep:
        make = lambda ps: build_optimizer(setup.optimizer, ps, lr, impl)  # noqa: E731
        offload = None
        if setup.offload_activations:
            from memlab.model.offload import OffloadActivations

            offload = OffloadActivations(simulate=True)
        return training_step(model, policy, torch.device("cpu"), make, loss_scaling=False,
                             set_to_none=setup.zero_grad_to_none, grad_accum_steps=setup.grad_accum_steps,
                             offload=offload)

    return {"step_fn": step_fn, "notes": tuple(notes)}


def gpt_step_parts(config: TransformerConfig, setup: Setup, *, lr: float = 1e-4, device_type: str = "cuda",
                   mesh: Any = None) -> dict[str, Any]:
    """Everything :func:`trace_step` needs to run the reference GPT under ``setup`` (see :func:`setup_parts`); with a
    ``mesh`` (:func:`memlab.tracing.fake_dist.fake_process_group`) the model is sharded with FSDP2 by the setup's plan
    (:func:`memlab.model.fsdp.shard_model`: ``fsdp_units``, ``fsdp_param_dtype``/``fsdp_reduce_dtype``, the loss
    ``fsdp_loss`` the root)."""
    from memlab.model.gpt import GPT
    from memlab.model.loss import LossOptions
    from memlab.model.step import model_dtype

    parts = setup_parts(setup, lr=lr, device_type=device_type)

    def model_fn() -> nn.Module:
        model = GPT(config, attention=setup.attention, recompute=setup.recompute, dtype=model_dtype(setup.policy),
                    loss=LossOptions.of(setup), recompute_every=setup.recompute_every)
        if mesh is not None:
            from memlab.model.fsdp import shard_model

            shard_model(model, zero_stage=setup.zero_stage, units=setup.fsdp_units, param_dtype=setup.fsdp_param_dtype,
                        reduce_dtype=setup.fsdp_reduce_dtype, mesh=mesh, offload=setup.fsdp_offload,
                        reshard_root=setup.fsdp_reshard_root, pin_memory=False)
        return model

    def batch_fn() -> tuple[torch.Tensor, torch.Tensor]:
        data = torch.randint(0, config.vocab_size, (setup.batch, setup.seq + 1))
        return data[:, :-1].clone(), data[:, 1:].clone()

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        from memlab.model.fsdp import step_loss

        return step_loss(model, *batch, setup.fsdp_loss if mesh is not None else "inside")

    return {**parts, "model_fn": model_fn, "batch_fn": batch_fn, "loss_fn": loss_fn}


def trace_gpt(config: TransformerConfig, setup: Setup, *, fake: bool = True, device_type: str = "cuda") -> Trace:
    """:func:`~memlab.tracing.tracer.trace_step` of the reference GPT (``memlab.model.gpt.GPT``) under ``setup``
    (training, one process; ``zero_stage`` 2/3 over ``world_size`` > 1 ranks runs FSDP2 over a fake process group,
    :mod:`memlab.tracing.fake_dist`).

    Traces run on CPU; ``device_type`` only picks the optimizer implementation ``auto`` means. CPU autocast and
    norm kernels differ from CUDA's in a few saved widths (:mod:`memlab.predict.memory.activations` lists them): compare
    with ``estimate(..., device_type='cpu')`` for byte equality.
    """
    if not isinstance(config, TransformerConfig):
        raise SetupError(f"trace_gpt needs a TransformerConfig, got {type(config).__name__}")
    check_trace_setup(setup, device_type, fake)
    if fake and config.is_moe:  # training and inference alike
        raise SetupError(f"{config.name}: the reference mixture of experts routes each token by its router's values "
                         "(torch.nonzero), which fake tensors do not have: trace rank 0 of a training step under "
                         "expert parallelism with balanced routing (memlab.tracing.experts.trace_gpt_ep), run it for "
                         "real at a small shape (fake=False), or take the formula's answer (memlab estimate)")
    if setup.task not in ("auto", "causal-lm"):
        raise SetupError(f"task={setup.task!r}: the reference GPT is a causal LM; trace a Hugging Face config with "
                         "that head (memlab.tracing.hf.trace_hf)")
    if setup.checkpoint_reentrant:
        raise SetupError("checkpoint_reentrant is transformers' checkpointing as peft's kbit preparation leaves it; "
                         "the reference GPT checkpoints non-reentrant: trace a Hugging Face config "
                         "(memlab.tracing.hf.trace_hf), or drop checkpoint_reentrant")
    if setup.mode == "inference":
        return _trace_inference(config, setup, fake=fake)
    if setup.world_size == 1:
        parts = gpt_step_parts(config, setup, device_type=device_type)
        notes = parts.pop("notes")
        return trace_step(**parts, fake=fake, name=config.name, setup=setup.to_dict(), notes=notes)
    from memlab.tracing.fake_dist import fake_process_group

    setup_parts(setup, device_type=device_type)  # validates before a process group is made
    with fake_process_group(setup.world_size) as mesh:
        parts = gpt_step_parts(config, setup, device_type=device_type, mesh=mesh)
        notes = (*parts.pop("notes"), f"FSDP2 over a fake {setup.world_size}-rank process group: rank 0's bytes, "
                 "gathered blocks included (collectives' buffers as FSDP2 allocates them; no communication); on fake "
                 "tensors the first optimizer step also counts DTensor's first sharding propagation (global-shape "
                 "temporaries no real run holds): marked unreliable and left out of the peak; the steady step is "
                 "exact")
        unreliable = (("first", "optimizer step"),) if fake else ()
        if fake and setup.optimizer == "sgd-momentum":  # its steady step runs ops its first step did not (the
            unreliable += (("steady", "optimizer step"),)  # buffers exist): DTensor propagates them afresh
            notes += ("SGD with momentum: the steady optimizer step's ops are new to DTensor's sharding propagation "
                      "too (its first step made the buffers), so that phase is marked unreliable as well",)
        return trace_step(**parts, fake=fake, name=config.name, setup=setup.to_dict(), notes=notes,
                          unreliable=unreliable)


def _trace_inference(config: TransformerConfig, setup: Setup, *, fake: bool) -> Trace:
    """Prefill of ``seq - 1`` tokens and one decode step to a context of ``seq``, as ``generate()`` runs them: the
    logits of the last ``setup.logits_to_keep`` positions (0: all) and the KV cache ``setup.kv_cache`` names
    (``static``: preallocated to ``seq`` tokens before the prefill; ``dynamic``: grown by ``torch.cat``).

    Phases ``prefill`` and ``decode`` (step ``steady``); the token ids (and a static cache) are in ``inputs``, a
    dynamic cache in ``activations`` (it is made during the phases).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    try:
        return _inference_phases(config, setup, fake=fake)
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise SetupError(f"traced inference reads a tensor's value ({exc.func}), which a fake tensor does not have: "
                         "trace it with fake=False at a small shape") from None


def _inference_phases(config: TransformerConfig, setup: Setup, *, fake: bool) -> Trace:
    """:func:`_trace_inference`'s run: the model, the cache, the two phases recorded."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memlab.device import torch_dtype
    from memlab.model.gpt import GPT
    from memlab.model.kv_cache import DynamicKVCache, KVCache

    if setup.inference_weights not in ("fp32", "bf16", "fp16") or setup.kv_cache_dtype != setup.inference_weights:
        raise SetupError("traced inference runs fp32/bf16/fp16 weights with the KV cache in the weight dtype: set "
                         "inference_weights and kv_cache_dtype alike")
    if setup.seq < 2:
        raise SetupError("traced inference needs seq >= 2 (a prompt and one decoded token)")
    dtype = torch_dtype(setup.inference_weights)
    keep = setup.logits_to_keep
    mode = FakeTensorMode(allow_non_fake_inputs=False) if fake else contextlib.nullcontext()
    with mode, torch.device("cpu"), torch.no_grad():
        model = GPT(config, attention=setup.attention, dtype=dtype).eval()
        static = setup.kv_cache == "static"
        cache = KVCache(config, setup.batch, setup.seq, dtype=dtype) if static else DynamicKVCache(
            config, setup.batch, dtype=dtype)
        ids = torch.randint(0, config.vocab_size, (setup.batch, setup.seq))
        tracker = fast_mem_tracker()
        tracker.track_external(model, ids, *(cache.k + cache.v if static else ()))
        rec = PhaseRecorder(tracker)
        with tracker:
            with rec.phase("steady", "prefill"):
                out = model(ids[:, :-1], cache=cache, logits_to_keep=keep)
                del out
            tracker.reset_mod_stats()
            with rec.phase("steady", "decode"):
                out = model(ids[:, -1:], cache=cache, logits_to_keep=keep)
                del out
            modules = module_rows(tracker)
    log = allocation_log(tracker, rec, "fake-tensor trace" if fake else "real-tensor trace (CPU)")
    best = max(rec.rows, key=lambda r: r.peak_bytes)
    kept = "every position's" if not keep else "the last position's" if keep == 1 else f"the last {keep} positions'"
    return Trace(model=config.name, setup=setup.to_dict(), fake=fake, phases=tuple(rec.rows),
                 peak_bytes=best.peak_bytes, peak_phase=best.phase, peak_step=best.step,
                 peak_by_category=dict(best.by_category), modules=modules,
                 notes=(f"inference: prefill of seq-1 tokens ({kept} logits), then one decoded token, with a "
                        f"{setup.kv_cache} KV cache; 'inputs' holds the token ids"
                        + (" and the preallocated cache" if static else "; the cache grows inside the phases")
                        + "; the reference GPT returns logits in the weight dtype, as transformers' causal LMs "
                        "do without labels",), allocations=log)
