"""run: twin 3, the training step on this machine (a CPU or a GPU), measured.

- ``runner``: :func:`memlab.run.runner.run_step` -> :class:`memlab.run.runner.Measurement` (model states by
  storage, saved-for-backward bytes by category, phase boundaries, step time and FLOPs; the allocator and NVML on
  CUDA).
- ``live_steps``: live tensor bytes op by op through several steps, beside the phase-aware prediction.
- ``sweep``: resumable JSON-lines sweeps of ``run_step``.
- ``hf``: a Hugging Face model built from its config, one step measured (``measure_hf``, ``run_hf``).
- ``spec``: :class:`memlab.run.spec.Run`, one calculator run described (HF config, shape, dtype, recipe), which
  ``measure_run`` runs here and the calculator shoot-out asks every estimator about.
- ``op_profile``: one step op by op under ``torch.profiler``, placed on the roofline.
- ``distributed``: real data-parallel ranks under torchrun: ``launch`` starts them, ``worker`` is each rank (DDP,
  ZeRO-1, FSDP2).

The step itself (precision wiring, optimizers, token batches) is :mod:`memlab.model.step`; the meters are
:mod:`memlab.measure`; what only one chapter demonstrates is in :mod:`memlab.labs`.
"""
