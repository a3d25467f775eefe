"""spec: what a run *is*: descriptions and their validity, no formulas.

- ``model``: :class:`~memlab.predict.spec.model.TransformerConfig` (sizes, exact parameter counts, the reference
  presets); ``traits``: how a model is written (the implementation traits the activation count follows);
- ``setup``: :class:`~memlab.predict.spec.setup.Setup` (shapes, precision, optimizer, parallelism, fine-tuning,
  loss, calling convention); ``precision``: precision policies as data; ``kernels``: the attention kernel the
  libraries run when none is named (transformers' default implementation, torch's SDPA dispatch per device);
- ``validate``: type and range checks of every public dataclass; ``frozen``: FrozenDict, the read-only mapping
  rows hold; ``versions``: the library releases memlab's terms were verified against, and the guard.
"""
