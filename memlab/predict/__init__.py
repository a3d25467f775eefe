"""predict: the closed-form side, numpy only and no torch.

``models`` (TransformerConfig, presets), ``setup`` (Setup: shapes, optimizer, sharding), ``precision`` (precision
policies as data), ``activations`` (saved-for-backward bytes, term by term), ``estimate`` (MemoryBreakdown), ``fit``
(will it fit, largest batch or sequence), ``flops`` (FLOPs, MFU/HFU, the roofline bound), ``hardware`` and
``hardware_table`` (the sourced accelerator table and name resolution), ``traits`` (how a model is written: the
implementation traits the activation count follows), ``hf`` (Hugging Face configs to TransformerConfig + traits).
"""
