"""run: torch code that executes a step. ``gpt`` (the reference model, one readable file), ``training_step``
(autocast, GradScaler, fp32 master weights), ``optimizers``, ``runner`` (run_step -> Measurement), ``sweep``
(resumable JSON-lines sweeps), ``roofline`` (matmul and bandwidth microbenchmarks), ``hf`` (Hugging Face models built
from configs and measured for one step)."""
