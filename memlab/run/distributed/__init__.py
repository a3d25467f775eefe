"""distributed: real data-parallel ranks under torchrun (gloo on a CPU, NCCL on GPUs).

``launch`` starts the ranks (``torchrun``'s launcher, the ranks' rows collected); ``handshake`` is the readiness
signal each rank gives before the rendezvous; ``supervise`` runs the launcher under its start-up and step clocks and
kills every rank's session past them; ``capacity`` says how many ranks the machine runs at once; ``worker`` is what
each rank runs: DDP, ZeRO-1 and FSDP2 steps, measured per rank.
"""
