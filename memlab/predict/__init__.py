"""predict: the closed-form side, numpy only and no torch.

``models`` (TransformerConfig, presets), ``setup`` (Setup: shapes, optimizer, sharding), ``precision`` (precision
policies as data), ``activations`` (saved-for-backward bytes, term by term), ``estimate`` (MemoryBreakdown),
``phases`` (bytes held at each phase of a step: the peak), ``fit`` (will it fit, largest batch or sequence),
``flops`` (FLOPs, MFU/HFU, the roofline bound), ``hardware`` and ``hardware_table`` (the sourced accelerator table
and name resolution).
"""
