"""Measurement: exact byte accounting, CUDA allocator, NVML, host, timelines, OOM parsing."""
