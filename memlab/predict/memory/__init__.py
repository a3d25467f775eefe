"""memory: the single-rank memory model, term by term.

- ``activations``: saved-for-backward bytes, row by row; ``rows``: the row names other code finds by name;
  ``family_terms``: the rows and refusals some families add (q/k norms, grouped experts); ``korthikanti``:
  Korthikanti et al. 2022's per-layer formulas, beside the count;
- ``states``: optimizer states; ``sharding``: ZeRO and tensor-parallel divisors; ``fsdp``: FSDP2's units, padded
  shards and gathered bytes per phase;
- ``loss``: the LM head and loss at large vocabularies; ``inference``: KV cache, generate()'s prefill and decode;
  ``finetune``: LoRA adapters and QLoRA's 4-bit base;
- ``plan``: what an estimate computes once per setup; ``phases``: bytes held at each phase of a step, and the peak;
- ``breakdown``: one rank's breakdown (:func:`~memlab.predict.memory.breakdown.rank_breakdown`) and the result
  records every estimate returns.
"""
