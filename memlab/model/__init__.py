"""model: the torch twin of :mod:`memlab.predict.models`, which the trace and the measured run both stand on.

- ``gpt``: the reference GPT (mixture-of-experts MLP and KV cache included), one readable file whose parameter
  names and shapes are exactly :meth:`memlab.predict.models.TransformerConfig.param_shapes`.
- ``saved``: which estimator category each tensor the GPT saves for backward belongs to.
- ``step``: the one training step: precision wiring (autocast, GradScaler, fp32 master weights) in
  :class:`memlab.model.step.TrainingStep`, built by :func:`memlab.model.step.build_training`, and seeded token
  batches.
- ``optimizers``: the optimizer table (torch's, plus memlab's 8-bit Adam) and its implementations.
- ``hf``: Hugging Face configs read and models built from them (never downloaded).
"""
