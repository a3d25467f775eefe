"""families: Hugging Face model families, from a ``config.json`` to a
:class:`~memlab.predict.spec.model.TransformerConfig`, one module per family, and the one way to name a model.

The family modules, each exporting one ``FAMILY`` record (:class:`~memlab.predict.families.family.Family`: its
``model_types``, ``defaults``, key account ``keys``, ``build`` and ``param_order``): ``gpt2``, ``opt``,
``gpt_neox``, ``phi``, ``llama`` (and the Llama-shaped builder ``mistral`` and ``qwen2`` share), ``mistral``,
``qwen2``, ``gemma``, ``qwen3``, ``phi3``, ``starcoder2``, ``olmo2``, ``stablelm``, ``gemma2``, ``gemma3``
(``gemma3_text``), ``gptj``, ``falcon``, ``mixtral`` and ``qwen_moe`` (``qwen3_moe`` and ``qwen2_moe``, whose
transformers code is shared). What they share:

- ``family``: the :class:`~memlab.predict.families.family.Family` record;
- ``common``: the builders' helpers (activation names, the rotary and window readers, the Llama-shaped
  ``decoder``, the experts of a mixture);
- ``keys``: the key-account type and the key groups every family shares (modelled, neutral, refused);
- ``registry``: the families by ``model_type`` (``FAMILIES``, ``SUPPORTED``, ``DEFAULTS``, ``ACCOUNTS``) and the
  key checks;
- ``order``: the order each family registers its parameters in (the order a for-loop optimizer steps them);
- ``reader``: ``read_config_json`` (the one safe reader) and ``from_hf``, which dispatches through the registry;
- ``resolver``: :func:`resolve` (``ref:NAME``, ``hf:NAME``, a path, a shipped name, a cached model id) and the
  shipped configs, ``configs/tiny`` (one scaled-down config per ``model_type``) and ``configs/full`` (published
  models).

How to add a family (say ``model_type`` ``foo``):

1. write ``foo.py`` here: ``DEFAULTS`` (the transformers defaults of the keys you read), ``KEYS`` (every key of
   ``AutoConfig.for_model("foo").to_dict()`` as modelled, neutral or refused: ``keys.listed_account``), ``build``
   (config dict -> TransformerConfig with its Implementation traits, each named in ``sources``) and
   ``FAMILY = Family.single("foo", ..., param_order=...)`` (with ``aliases`` when the config class has an
   ``attribute_map``); the registry finds the module by its ``FAMILY``;
2. ship two configs: ``configs/tiny/foo.json`` (d_model 64, 2 layers, vocab 512, a ``_memlab_note``) and
   ``configs/full/PUBLISHED-NAME.json`` (a published model, with its ``_memlab_source``).

The tests then pick it up: ``tests/predict/families/test_families.py`` (its configs exist and resolve),
``tests/predict/families/test_config_keys.py`` (every key of the installed config class accounted),
``tests/predict/families/test_hf_order.py`` (parameter order against the real model),
``tests/studies/test_key_draws.py`` (every key's parameter count against the real model), ``tests/run/test_hf.py``
(saved bytes against a real step) and ``tests/cli/test_hf_cli.py`` (``memlab estimate --hf``) run over every
shipped config.
"""

from memlab.predict.families.resolver import locate, resolve, resolve_with_raw

__all__ = ["locate", "resolve", "resolve_with_raw"]
