"""run: torch code that executes a step. ``gpt`` (the reference model, one readable file), ``training_step``
(autocast, GradScaler, fp32 master weights), ``optimizers``, ``runner`` (run_step -> Measurement), ``sweep``
(resumable JSON-lines sweeps), ``roofline`` (matmul and bandwidth microbenchmarks), ``trace`` (any model's step on
fake tensors, phase by phase: ``trace``, ``trace_gpt``), ``trace_hf`` (Hugging Face causal LMs from a config),
``fake_dist`` (FSDP2 over a fake process group, for sharded traces in one process)."""
