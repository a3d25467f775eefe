"""labs: what only one chapter demonstrates, one module per chapter topic (d2l's ``train_ch3``, named by topic).

- ``oom`` (chapter 01): leak loops and their growth per iteration, the measured fit sweep, an OOM's kind.
- ``allocator`` (chapter 01): the CUDA caching allocator's documented rules (rounding, pools, splitting, the
  free-and-retry before an OOM) replayed on a sequence of requests and drawn.
- ``precision`` (chapter 03): loss scaling and fp16 underflow, what autocast casts, deprecated AMP calls.
- ``checkpointing`` (chapter 04): checkpointing policies measured (every-k, ``checkpoint_sequential``, sqrt(n)).
- ``step_time`` (chapters 08, 09): where a training loop's time goes (loader, host syncs, logging, checkpoints).
- ``monitors`` (chapter 09): what GPU-Util and nvidia-smi count, beside the work done.
- ``inference`` (chapter 10): int8 weight bytes, tokens routed to each expert.

The rooms below (``model``, ``tracing``, ``run``, ``measure``, ``predict``) never import ``labs``; the tests
enforce it.
"""
