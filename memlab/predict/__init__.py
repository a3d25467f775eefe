"""predict: the closed-form side, numpy only and no torch. Sub-rooms, bottom-up (each imports only those before it):

- ``spec/``: what a run is (config, traits, Setup, precision, validation, versions);
- ``families/``: Hugging Face configs to a TransformerConfig, family by family;
- ``hardware/``: the accelerator table; ``compute/``: FLOPs, MFU, attention I/O;
- ``memory/``: the single-rank memory model (activations, states, loss, inference, fine-tuning, phases);
- ``parallel/``: per-rank bytes of pipeline, context and expert parallelism, communication, efficiency;
- ``unmodelled``: what an estimate names as left out, with sizes; ``estimate``: the estimate and its result;
  ``fit``: will it fit, the largest batch or sequence, the levers; ``paging``: KV-cache reservation policies.

Where does X go? A new model family: ``families/``. A new saved tensor: ``memory/activations``. A parallelism whose
ranks differ: ``parallel/``. Something the formula does not model: ``unmodelled``.
"""
