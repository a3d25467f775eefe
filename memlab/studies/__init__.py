"""studies: the campaigns that run models, traces and steps and hand what they find to :mod:`memlab.compare`.

A study runs something (a real step, a fake-tensor trace, torchrun ranks, other people's estimators) over a grid or
a seeded sample, and judges the result with compare's machinery (the ledger, the scoring, the verdicts and the one
tolerance, :mod:`memlab.compare.tolerances`). The room sits above ``compare``: studies import compare, never the
other way round.

- ``calculators``: the calculator shoot-out, every public estimator run on the same :class:`memlab.run.spec.Run`
  next to a real step or the full-size trace; ``formulas``, the calculators that are formulas (gpu_poor, the
  Korthikanti row of Transformer Math 101 and the Ultra-Scale Playbook); ``shootout``, the same tools and memlab on
  the published GPU measurements' rows, each asked only what it claims (scored, a bound, or not expressible).
- ``setup_draws``: the estimator against memlab's trace over a seeded sample of the Setup space, phase by phase.
- ``inference_draws``: generated inference setups (both KV caches, kept logits), the formula's prefill and decode
  against the reference GPT's trace.
- ``hf_draws``: seeded Hugging Face configs and calls of every family, two real steps each, judged exact, named,
  traced, refused or off; ``joint_keys``, the widened configs they draw: every key a family's account models, at
  once.
- ``key_draws``: every config key of every family flipped alone and drawn jointly, the parameter count and the
  estimate's states against the real model built on the meta device, judged exact, refused, unbuildable or off.
- ``drift``: the canary of ``make upgrade-check``: every family, precision and attention, the traces, peft and
  bitsandbytes against real steps under the installed releases, judged exact, drifted or broken
  (``python -m memlab.studies.drift``).
- ``titan``: torchtitan's memory estimator as a peer on the same FSDP2 setups, residuals named.
- ``parallel``: TP, SP, PP, CP and ZeRO layouts of one model side by side, per rank (the estimator's layouts).
- ``pipeline``: pipeline ranks run on a fake group and counted, against their prediction.
- ``parallel_ranks``: pipeline and tensor-parallel ranks measured on gloo under torchrun.
- ``parallel_traces``: TP, TP + SP and ring-attention CP traced on fake groups rank by rank, residuals named.
"""
