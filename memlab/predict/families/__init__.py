"""families: Hugging Face model families, from a ``config.json`` to a
:class:`~memlab.predict.spec.model.TransformerConfig`.

- ``reader``: ``read_config_json`` (the one safe reader), ``from_hf`` and the older families' builders and defaults;
  ``builders``: the newer families' builders and defaults;
- ``keys``: every key of each family's config, modelled, memory-neutral or refused; ``new_keys``: the newer
families' key accounts; - ``order``: the order each family registers its parameters in (the order a for-loop optimizer
steps them).
"""
