"""parallel: ranks that hold different bytes, one module per parallelism.

- ``pipeline``: pipeline and context parallelism per rank (stages, in-flight micro-batches, buffers, ring K/V);
- ``experts``: expert parallelism per rank (experts per rank, tokens received, all-to-all buffers);
- ``communication``: bytes moved per ZeRO stage; ``efficiency``: pipeline bubble, scaling efficiency.
"""
