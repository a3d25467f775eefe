"""What the device adds to the bytes a step holds: PyTorch's CUDA caching allocator, replayed.

- ``alloc_conf``: ``PYTORCH_CUDA_ALLOC_CONF`` as a frozen dataclass and its parser, the size rules (rounding,
  pools, segment sizes), each from torch 2.13's source;
- ``allocator``: the allocator's state (segments, blocks, pools) and its ``malloc``/``free``, rule by rule;
- ``replay``: a step's allocation log (the fake-tensor trace records one) through the model: peak reserved, active
  and requested bytes, fragmentation and the largest free block, per phase;
- ``device``: what the device holds outside the step's tensors (CUDA context, cuBLAS/cuBLASLt workspaces, NCCL
  buffers, DDP's buckets, the formula's reserve bound), each with its source, stacked into the allocated,
  reserved and device-used (nvidia-smi) peaks of a ``--gpu`` verdict.

Models of the libraries' rules and defaults, numpy-free and torch-free; never a GPU measurement.
"""
