"""distributed: real data-parallel ranks under torchrun (gloo on a CPU, NCCL on GPUs).

``launch`` starts the ranks (``torchrun``'s launcher, a readiness handshake, the ranks' rows collected);
``worker`` is what each rank runs: DDP, ZeRO-1 and FSDP2 steps, measured per rank.
"""
