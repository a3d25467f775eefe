"""model: the torch twin of :mod:`memlab.predict.models`, which the trace and the measured run both stand on.

- ``gpt``: the reference GPT (mixture-of-experts MLP and KV cache included), one readable file whose parameter
  names and shapes are exactly :meth:`memlab.predict.models.TransformerConfig.param_shapes`.
- ``saved``: which estimator category each tensor the GPT saves for backward belongs to.
- ``step``: the one training step: precision wiring (autocast, GradScaler, fp32 master weights), the phased loop
  :func:`memlab.model.step.train_step` with its :class:`memlab.model.step.Meter` hook, and seeded token batches.
- ``optimizers``: the optimizer table (torch's, plus memlab's 8-bit Adam) and its implementations.
- ``hf``: Hugging Face configs read and models built from them (never downloaded).
"""
