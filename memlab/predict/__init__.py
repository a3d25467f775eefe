"""predict: the closed-form side, numpy only and no torch.

- ``models``: TransformerConfig, exact parameter counts, presets (MoE included); ``hf``: Hugging Face configs to a
  TransformerConfig; ``config_keys``: every key of each family's config modelled, memory-neutral or refused;
  ``traits``: how a model is written (the implementation traits the activation count follows);
  ``hf_families``: the newer HF families' builders (Qwen3, Phi-3, Starcoder2, OLMo 2, StableLM, Gemma 2 and 3,
  GPT-J, Falcon, Mixtral, Qwen3-MoE, Qwen2-MoE), ``family_keys``: every config key of those families accounted for,
  ``family_terms``: their q/k norm rows, the grouped MoE rows (router, routed pairs) and setup refusals;
  ``hf_order``: the order each family registers its parameters in (the order a for-loop optimizer steps them);
  ``versions``: the transformers, torch and peft releases those terms were verified against, and the guard that
  says so when others are installed.
- ``setup``: Setup (shapes, optimizer and its implementation, recompute, attention, sharding); ``precision``:
  precision policies as data; ``validate``: type and range checks of every public dataclass; ``frozen``:
  FrozenDict, the read-only mapping rows hold (it pickles and deep-copies).
- ``activations``: saved-for-backward bytes, term by term; ``korthikanti``: Korthikanti et al. 2022's per-layer
  formulas (Table 2), beside the count; ``optimizer_states``, ``sharding``, ``inference``: the
  other terms; ``fsdp``: FSDP2's units, padded shards and gathered bytes per phase; ``unmodelled``: what an
  estimate names as left out, with sizes (NamedTerm); ``estimate``:
  MemoryBreakdown; ``plan``: what an estimate computes once per setup (batch and seq aside, cached);
  ``phases``: bytes held at each phase of a step and the peak; ``loss``: the LM head and loss at large
  vocabularies (chunks, kept positions); ``fit``: will it fit, the largest batch or sequence, and the levers that
  make a step fit (``levers``); ``finetune``: LoRA adapters on a frozen base and QLoRA's 4-bit NF4 base (states
  and the activations a frozen base does not save).
- ``flops``: FLOPs, MFU/HFU, the roofline bound; ``parallelism``: pipeline bubble, scaling efficiency; ``parallel``:
  pipeline and context parallelism per rank (stages, in-flight micro-batches, pipeline buffers, ring K/V);
  ``experts``: expert parallelism per rank (experts per rank, tokens received, all-to-all buffers);
  ``communication``: bytes moved per ZeRO stage; ``attention_io``: attention's HBM traffic; ``paging``: KV-cache
  reservation policies.
- ``hardware`` + ``hardware_table``: the sourced accelerator table and name resolution.
"""
