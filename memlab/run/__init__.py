"""run: torch code that executes a step.

- ``gpt``: the reference model (one readable file), ``moe``: its mixture-of-experts MLP; ``hf``: Hugging Face
  models built from configs and measured.
- ``training_step``: autocast, GradScaler, fp32 master weights; ``optimizers``; ``runner``: ``run_step`` ->
  Measurement; ``sweep``: resumable JSON-lines sweeps.
- ``trace``, ``trace_hf``, ``fake_dist``: any model's step on fake tensors, phase by phase, sharded ones included.
- ``distributed`` + ``dist_worker``: real data-parallel ranks under torchrun (DDP, ZeRO-1, FSDP2).
- ``checkpointing``, ``live_steps``, ``leaks``, ``loss_scaling``, ``quantized``: the chapters' experiments.
- ``roofline`` (microbenchmarks), ``profile`` (a step op by op), ``step_time`` (where a step's time goes),
  ``utilisation`` (what monitors count, beside the work done).
"""
