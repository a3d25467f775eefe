"""torchtitan's memory estimator, rebuilt from its building blocks, on the setup memlab traces: the peer of issue 24.

torchtitan v0.2.2 shipped ``scripts/estimate/estimation.py`` [torchtitan-fsdp] (removed in the config refactor,
torchtitan commit 76d5c72e2, February 2026): build the model under ``FakeTensorMode``, shard it with
``apply_fsdp`` (embedding, each block, ``[norm, output]`` as units; ``MixedPrecisionPolicy(bf16, fp32)``), run two
iterations of
``loss_fn(model(ids), labels)``, backward, ``clip_grad_norm_(foreach=True)``, the optimizer step and ``zero_grad``
under torch's ``FSDPMemTracker``, and print the tracker's peak. torchtitan itself does not import on a CPU-only
torch 2.13: ``import torchtitan.models.llama3`` reaches ``torchtitan/models/moe/kernels.py``'s ``import triton``
(``ModuleNotFoundError: No module named 'triton'``; a stub breaks ``torch._dynamo``). So
:func:`titan_estimate` runs the same protocol with the same torch pieces on memlab's reference GPT: the plan is
:func:`memlab.model.fsdp.shard_model` with ``units="torchtitan"`` (torchtitan's ``apply_fsdp``, unit for unit),
the loss is computed outside the model, the tracker is ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``,
and the step clips gradients as torchtitan's does. What differs from torchtitan's own run is its model code (its
RMSNorm and attention save other tensors, an implementation trait like Hugging Face's): named, not measured here.

Each iteration's peak is read by re-basing the tracker's global peak at the iteration's start (the private fields
:class:`memlab.tracing.tracer.PhaseRecorder` uses); ``printed_max`` is what torchtitan prints: the maximum over
both iterations, which under fake tensors includes DTensor's first sharding propagation in the first optimizer step.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup, resolve_optimizer_impl

TITAN_MAX_NORM = 1.0
"""torchtitan's default ``training.max_norm`` (the clip value does not change the bytes)."""


def titan_setup(setup: Setup) -> Setup:
    """``setup`` as torchtitan trains it: FSDP2 with its wrapping plan, the loss outside the model, bf16 gathered
    parameters reduced in fp32, fp32 storage (ZeRO-3 over ``world_size`` ranks, at least 2)."""
    return setup.with_(precision="fp32", zero_stage=3, world_size=max(2, setup.world_size), fsdp_units="torchtitan",
                       fsdp_loss="outside", fsdp_param_dtype="bf16", fsdp_reduce_dtype="fp32")


def titan_estimate(config: TransformerConfig, setup: Setup, *, device_type: str) -> dict[str, int]:
    """torchtitan's estimation protocol on the reference GPT under ``setup`` (use :func:`titan_setup`): the peak of
    each of its two iterations (``step1``, ``step2``) and ``printed_max`` (both), bytes on rank 0."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from memlab.model.fsdp import shard_model, step_loss
    from memlab.model.gpt import GPT
    from memlab.model.optimizers import build_optimizer
    from memlab.tracing.fake_dist import fake_process_group
    from memlab.tracing.tracer import quiet_mod_tracker

    _check(config)
    if setup.zero_stage < 2 or setup.world_size < 2 or setup.mode != "train":
        raise SetupError("the torchtitan peer runs FSDP2 training: pass titan_setup(setup)")
    impl = resolve_optimizer_impl(setup.optimizer, setup.optimizer_impl, device_type)
    with fake_process_group(setup.world_size) as mesh, FakeTensorMode(), torch.device("cpu"):
        model = GPT(config, attention=setup.attention, recompute=setup.recompute).train()
        shard_model(model, zero_stage=setup.zero_stage, units=setup.fsdp_units, param_dtype=setup.fsdp_param_dtype,
                    reduce_dtype=setup.fsdp_reduce_dtype, mesh=mesh,
                    reshard_root=setup.fsdp_reshard_root)
        opt = build_optimizer(setup.optimizer, list(model.parameters()), 1e-4, impl)
        ids = torch.randint(0, config.vocab_size, (setup.batch, setup.seq))
        labels = torch.randint(0, config.vocab_size, (setup.batch, setup.seq))
        tracker = FSDPMemTracker(mod=model, optm=opt)
        tracker.track_inputs((ids, labels))
        peaks = []
        with quiet_mod_tracker(), tracker:
            for _ in range(2):
                current = tracker.get_tracker_snapshot("current")
                tracker._peak_mem_snap = deepcopy(current)
                tracker._peak_mem = {dev: int(d.get("Total", 0)) for dev, d in current.items()}
                loss = step_loss(model, ids, labels, setup.fsdp_loss)
                loss.backward()
                del loss
                torch.nn.utils.clip_grad_norm_(model.parameters(), TITAN_MAX_NORM, foreach=True)
                opt.step()
                opt.zero_grad()
                peaks.append(sum(int(d.get("Total", 0)) for d in tracker.get_tracker_snapshot("peak").values()))
                tracker.reset_mod_stats()
    return {"step1": peaks[0], "step2": peaks[1], "printed_max": max(peaks)}


def _check(config: Any) -> None:
    if not isinstance(config, TransformerConfig):
        raise SetupError(f"the torchtitan peer needs a TransformerConfig, got {type(config).__name__}")
