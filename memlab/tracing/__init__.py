"""tracing: twin 2, a training step on fake tensors (FakeTensorMode + MemTracker): exact bytes at full size on a CPU.

- ``tracer``: :func:`memlab.tracing.tracer.trace` for any module, the :class:`memlab.tracing.tracer.Trace` result
  and the phase meter over MemTracker; ``CUDA_TERMS``, what a CUDA run adds that no trace sees.
- ``gpt``: :func:`memlab.tracing.gpt.trace_gpt`, the reference GPT under a Setup (training or inference).
- ``hf``: :func:`memlab.tracing.hf.trace_hf`, a Hugging Face causal LM built from its config.
- ``progress``: progress lines per block and a time bound for a trace (a per-token Python loop, Mamba's CPU
  scan, would run for many minutes with no output).
- ``fake_dist``: a fake process group, so FSDP2 shards on one CPU as on N ranks.
- ``pipeline``: torch.distributed.pipelining's 1F1B and GPipe schedules on that fake group, one stage counted.
- ``tensor_parallel``: DTensor tensor (and sequence) parallelism on that fake group, any rank traced.
- ``context_parallel``: ring attention written on point-to-point ops (torch's CP refuses the CPU kernel), any rank.
- ``experts``: expert parallelism (experts split over ranks, all_to_all_single dispatch and combine) on that fake
  group, rank 0 traced.
- ``fit``: :func:`memlab.tracing.fit.traced_search`, the largest batch or sequence that fits a card, each candidate
  traced and its allocations replayed through the caching allocator model (between the formula's two ends).
- ``peer``: torchtitan's memory-estimation protocol (FSDPMemTracker, its FSDP2 plan) on the reference GPT.
- ``arguments``: the traces' argument checks (functions, what they return, setup and device type): one SetupError.

The room is called ``tracing`` so that ``memlab.trace`` stays the function users call
(``memlab.trace(model_fn, batch_fn, optimizer_fn)``).
"""
