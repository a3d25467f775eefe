"""predict: the closed-form side, numpy only and no torch. Sub-rooms, bottom-up (each imports only those before it):

- ``spec/``: what a run is (config, traits, Setup, precision, validation, versions);
- ``families/``: Hugging Face configs to a TransformerConfig, family by family;
- ``hardware/``: the accelerator table; ``compute/``: FLOPs, MFU, attention I/O;
- ``memory/``: the single-rank memory model (activations, states, loss, inference, fine-tuning, phases);
- ``gpu/``: what the device adds: PyTorch's CUDA caching allocator replayed on a step's allocation log (reserved,
  active and requested peaks, fragmentation), its ``PYTORCH_CUDA_ALLOC_CONF``;
- ``parallel/``: per-rank bytes of pipeline, context and expert parallelism, communication, efficiency;
- ``coverage``: what memlab models, in one table: refusals with their way out, assumptions, and the terms an estimate
  names as left out, with sizes; ``estimate``: one estimate for every setup, one device or per rank;
- ``fit``: will it fit, the largest batch or sequence (``serving_table``: the largest batch per context), the
  levers; ``paging``: KV-cache reservation policies and a serving engine's budget (vLLM's KV blocks).

Where does X go? A new model family: ``families/``. A new saved tensor: ``memory/activations``. A parallelism whose
ranks differ: ``parallel/`` (a module returning its ranks, called by ``estimate``). The FLOPs of a kind of step
(full training, LoRA, frozen layers, a recompute policy): ``compute/flops`` (``step_flops``). A recompute policy: a
``spec/setup`` choice, its kept tensors in ``memory/activations`` (``every_k_rows``, ``op_policy_rows``), its re-run
FLOPs in ``compute/flops.recomputed_flops``, the torch side in ``memlab.model.policies``. A moment of generate()'s
prefill or decode (a cache kind, a transient): ``memory/inference``, checked against the reference GPT's trace
(``memlab.studies.inference_draws``). Bytes that live outside torch's allocator: a field of their own on
``MemoryBreakdown``, in no phase (``host_bytes``: offloaded to the host; ``paged_bytes``: a paged optimizer's states in
CUDA managed memory, ``memory/states.paged_tensor_bytes``), and the fit verdict says what they mean. What memlab does
or does not model, and what it says about it: a row of
``coverage`` (a task head other than the causal LM's is one: the trace answers it).
"""
