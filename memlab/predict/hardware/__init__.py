"""hardware: accelerators as data.

- ``table``: the sourced accelerator table (memory, bandwidth, peak FLOP/s per dtype);
- ``gpus``: name resolution (``resolve``), the usable capacity of a device, and what a reader may pass.
"""
