"""model: the torch twin of :mod:`memlab.predict.spec.model`, which the trace and the measured run both stand on.

- ``gpt``: the reference GPT (mixture-of-experts MLP included), one readable file whose parameter names and shapes
  are exactly :meth:`memlab.predict.spec.model.TransformerConfig.param_shapes`; ``kv_cache``: its preallocated KV cache.
- ``loss``: the LM head and loss (plain, chunked, a pure-torch fused linear + cross-entropy after Liger-Kernel;
  ``logits_to_keep``) and ``offload``: activation offload to host memory with its bookkeeping.
- ``saved``: which estimator category each tensor the GPT saves for backward belongs to.
- ``step``: the one training step every caller runs: :func:`memlab.model.step.train_step` (forward -> backward ->
  optimizer step -> zero_grad, phase by phase) with a :class:`memlab.model.step.Meter` for what a caller records;
  the precision wiring (autocast, GradScaler, fp32 master weights) in :class:`memlab.model.step.TrainingStep`, built
  by :func:`memlab.model.step.build_training`; seeded token batches.
- ``optimizers``: the optimizer table (torch's, plus memlab's 8-bit Adam) and its implementations.
- ``hf``: Hugging Face configs read and models built from them (never downloaded); ``tasks``: the task heads
  (causal LM, masked LM, sequence and token classification, question answering) with their labels and losses.
- ``fsdp``: the one FSDP2 wrapping plan (units, reshard, MixedPrecisionPolicy, offload) and where the loss is
  computed, shared by the trace and the torchrun ranks.
"""
