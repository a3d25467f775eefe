"""Parameter-efficient fine-tuning: LoRA adapters on a frozen base, and QLoRA's 4-bit NF4 base, term by term.

A LoRA adapter on a Linear ``W`` (``in -> out``) adds ``A`` (``r x in``) and ``B`` (``out x r``) and computes
``W x + (alpha / r) * B A dropout(x)`` (Hu et al. 2021, "LoRA", Sec. 4.1) [hu2021]; only A and B train. What that
changes, each term checked against peft 0.21 on CPU (``tests/predict/memory/test_finetune.py``):

- **states** [peft]: the base keeps its weights (no gradient, no optimizer state); adapters are fp32 even over a
  16-bit base (``LoraConfig(autocast_adapter_dtype=True)``, peft ``tuners_utils.cast_adapter_dtype``), so their
  gradients and Adam moments are fp32 too (``zeros_like``), 2 x 4 B per element, plus one step counter per tensor;
- **activations**: autograd saves a tensor only for a gradient it must compute. A frozen Linear saves its weight
  (already counted), not its input; a frozen RMSNorm weight's product ``weight * x_hat`` keeps nothing (LayerNorm's
  kernel keeps input, mean and rstd whatever needs the gradient); a frozen embedding keeps no token ids. Each adapter
  keeps its input for ``A``'s gradient (peft first casts it to the adapter's fp32: a new fp32 copy over a 16-bit base,
  one per adapted module; under autocast A's matmul casts it to bf16, one copy per module; the same tensor
  otherwise) and the ``t x r`` output of ``A`` for ``B``'s; dropout > 0 keeps
  its noise tensor and the dropped input per adapted module (CPU; CUDA keeps a 1-byte mask). The bottom block's
  input needs no gradient, so its first norm keeps nothing and its attention core only what the adapted projections
  need (:func:`finetune_rows`);
- **under checkpointing** (``recompute='full'``: transformers' per-layer checkpointing, non-reentrant): every block
  keeps only its input; ``activation_checkpointing_enable`` (transformers 5) and peft's ``PeftModel`` make the
  frozen embeddings' output require a gradient (``enable_input_require_grads``), so the bottom block saves what the
  blocks above it save when it is recomputed, and the frozen blocks of ``finetune='frozen'`` keep their inputs too
  (:func:`checkpointed_input_grad`); autocast caches the 16-bit cast of trainable weights only
  (:func:`autocast_cache_bytes`). Gradient accumulation holds the trainable (fp32 adapter) gradients between
  micro-steps, as the phase model holds any gradients. Both exact against a real peft step on CPU and its trace
  (``tests/predict/memory/test_finetune.py``, ``benchmarks/finetune_recompute.py``);
- **QLoRA** [dettmers2023] [bitsandbytes]: the base's block matrices in NF4 (4 bits per weight), one absmax per 64
  weights quantised again to 8 bits with one fp32 absmax per 256 of them (double quantisation: 8/64 + 32/(64*256) =
  0.127 bits per parameter, QLoRA Sec. 3), plus per tensor the 16-entry NF4 code, the 256-entry 8-bit code and an fp32
  offset; embeddings, norms and the LM head stay 16-bit. bitsandbytes 0.50's ``MatMul4Bit`` keeps only the packed
  weight for backward (``ctx.tensors = (None, B)``; versions before kept the input ``A`` too), so the activations
  are LoRA's over a bf16 base; its backward dequantises one weight at a time to bf16 (a transient of the largest
  matrix, the named overhead ``qlora_dequantised_weight``). bitsandbytes 0.45+ quantises and runs NF4 on the CPU,
  so QLoRA is measured here too, and traced on fake tensors through bitsandbytes' registered fake kernels
  (``tests/predict/memory/test_finetune.py``); the CUDA storage is checked by a GPU test; paged optimizers are
  predicted only;
- **QLoRA in fp16** (``precision='amp-fp16'``, the recipe of cards without bf16, a T4: ``bnb_4bit_compute_dtype=
  float16``, ``Trainer(fp16=True)``'s autocast and GradScaler, fp32 adapters): the model is fp32 (amp-fp16's weights),
  so the embeddings, norms and head are 4 B; ``Linear4bit.forward`` casts its input to fp16 and its output back to
  the input's dtype (bitsandbytes 0.50 nn/modules.py ``.to(inp_dtype)``), and its bias to fp16 in place: the MLP's
  d_ff tensors are fp32, no autocast copy of an NF4 weight exists, the biases are 2 B. Measured equal on a CPU step
  with a real GradScaler and on its trace (``tests/predict/memory/test_qlora_fp16.py``); the GradScaler's scale and
  found-inf scalars (a few bytes) are not counted, as for ``amp-fp16`` training.

Pure arithmetic, no torch. Units: bytes and elements.
"""

from __future__ import annotations

import math
from typing import Any

from memlab.errors import ConfigError, SetupError
from memlab.predict.memory.rows import RowName
from memlab.predict.memory.states import PAGED_OPTIMIZERS, adam8bit_bytes, paged_optimizer_bytes
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import LORA_DEFAULT_RANK, LORA_DEFAULT_TARGETS, LORA_KINDS, parse_targets

__all__ = ["LORA_DEFAULT_RANK", "LORA_DEFAULT_TARGETS", "LORA_KINDS", "parse_targets"]  # re-exported from setup
ADAPTER_BYTES = 4
"""Bytes per adapter element: fp32 (peft casts 16-bit adapters to fp32 by default)."""
NF4_BLOCK = 64
"""bitsandbytes ``quantize_4bit`` blocksize for NF4 weights (QLoRA Sec. 3: blocksize 64)."""
NF4_NESTED_BLOCK = 256
"""Double quantisation: the 8-bit absmax values are quantised in blocks of 256 (QLoRA Sec. 3; bitsandbytes
``quantize_blockwise(absmax, blocksize=256)`` in ``quantize_4bit(compress_statistics=True)``)."""
NF4_TENSOR_CONSTANT_BYTES = 16 * 4 + 256 * 4 + 4
"""Per quantised tensor: the NF4 code (16 fp32), the nested 8-bit dynamic code (256 fp32), the fp32 offset."""


PAGED_OPTIMIZER_NOTE = (
    "a paged optimizer (bitsandbytes' Paged*, optimizer paged-adamw or paged-adam-8bit) keeps the states of tensors of "
    ">= 1e5 elements in CUDA managed memory, outside torch's allocator: reported apart as paged_bytes, not in the "
    "peak (memlab.predict.memory.states.paged_tensor_bytes); LoRA adapters under 1e5 elements (r x d below it) are "
    "not paged")
"""What a paged optimizer changes, the named assumption every QLoRA estimate carries."""


def qlora_bits_per_parameter(block: int = NF4_BLOCK, nested: int = NF4_NESTED_BLOCK) -> float:
    """Bits per parameter of the quantisation constants with double quantisation: an 8-bit absmax per ``block``
    weights and an fp32 absmax per ``nested`` of those: ``8/block + 32/(block*nested)`` = 0.127 for 64/256 (QLoRA,
    Dettmers et al. 2023, Sec. 3 "Double Quantization") [dettmers2023]; without it ``32/block`` = 0.5."""
    return 8 / block + 32 / (block * nested)


def nf4_tensor_bytes(numel: int) -> int:
    """Bytes of one NF4 tensor with double quantisation as bitsandbytes stores it: packed weights (2 per byte),
    uint8 absmax per 64, fp32 absmax per 256 absmax values, and :data:`NF4_TENSOR_CONSTANT_BYTES` [bitsandbytes]."""
    blocks = math.ceil(numel / NF4_BLOCK)
    return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / NF4_NESTED_BLOCK) + NF4_TENSOR_CONSTANT_BYTES


def lora_modules(config: TransformerConfig, targets: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """``(kind, in_features, out_features)`` of each adapted Linear in one block (the fused QKV projection once as
    ``qkv``). A gated kind on a non-gated MLP raises :class:`ConfigError`."""
    h, q, kv, f = config.d_model, config.q_dim, config.kv_dim, config.ffn
    out: list[tuple[str, int, int]] = []
    if config.impl.fused_qkv and any(k in targets for k in ("q", "k", "v")):
        out.append(("qkv", h, q + 2 * kv))
    shapes = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    for kind in LORA_KINDS:
        if kind not in targets or (config.impl.fused_qkv and kind in ("q", "k", "v")):
            continue
        if kind == "gate" and config.mlp != "swiglu":
            if set(targets) == set(LORA_KINDS):
                continue  # all-linear: every Linear the block has
            raise ConfigError(f"lora_targets names 'gate', but this model's MLP ({config.mlp}) has no gate "
                              "projection: use up and down")
        out.append((kind, *shapes[kind]))
    return out


def adapter_elements(config: TransformerConfig, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable elements of all adapters: ``L * sum(r * (in + out))`` over the adapted modules."""
    return config.n_layers * sum(rank * (i + o) for _, i, o in lora_modules(config, targets))


def qlora_base_bytes(config: TransformerConfig, rest_bytes: int = 2) -> tuple[int, int]:
    """(bytes, quantised elements) of QLoRA's base: every 2-D attention/MLP matrix in NF4 (:func:`nf4_tensor_bytes`,
    tensor by tensor), the biases of those Linears in the 16-bit compute dtype (``Linear4bit.forward`` casts its bias
    to it in place at the first forward: bitsandbytes 0.50 nn/modules.py, ``bias.data = bias.data.to(x.dtype)``),
    every other parameter (embeddings, norms, the LM head) at ``rest_bytes`` each: the dtype the model was loaded
    in (2: bf16, precision='bf16'; 4: fp32 under precision='amp-fp16')."""
    total = quantized = 0
    for _, shape, comp in config.param_shapes():
        n = math.prod(shape)
        if len(shape) == 2 and comp in ("attention", "mlp"):
            total += nf4_tensor_bytes(n)
            quantized += n
        elif comp in ("attention", "mlp"):
            total += 2 * n
        else:
            total += rest_bytes * n
    return total, quantized


def finetune_states(config: TransformerConfig, setup: Any, n_base: int,
                    step_on_device: bool) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """(params, grads, optimizer) bytes of a LoRA/QLoRA setup on one device, the optimizer detail, and notes.

    ``n_base``: the base model's elements. Base weights in the policy's parameter dtype (``lora``) or NF4 with
    16-bit embeddings, norms and head (``qlora``, :func:`qlora_base_bytes`); adapters fp32 (:data:`ADAPTER_BYTES`)
    with fp32 gradients and states.
    """
    rank, targets = setup.lora_r, setup.lora_target_kinds
    mods = lora_modules(config, targets)
    n_ad = adapter_elements(config, rank, targets)
    tensors = adapter_tensors(config, setup)
    pb = setup.policy.param_bytes
    if setup.finetune == "qlora":
        base, quantizable = qlora_base_bytes(config, pb)
        notes = [f"QLoRA base: {quantizable:,} block-matrix weights in NF4 with double quantisation "
                 f"({4 + qlora_bits_per_parameter():.3f} bits each, QLoRA Sec. 3) and {n_base - quantizable:,} "
                 f"embedding/norm/head weights at {pb} B (the model's dtype), from the sources; equal to a CPU step "
                 "with bitsandbytes' CPU kernels and to its fake-tensor trace (tests/predict/memory/test_finetune.py; "
                 "the CUDA storage by a GPU test); one dequantised 16-bit weight (the compute dtype) at a time is the "
                 "overhead qlora_dequantised_weight; " + PAGED_OPTIMIZER_NOTE]
    else:
        base = n_base * pb
        notes = [f"LoRA: the {n_base:,} base weights are frozen ({pb} B each, no gradients or optimizer state)"]
    opt = setup.optimizer
    if opt in ("adam", "adamw"):
        moments = 2 * ADAPTER_BYTES * n_ad
    elif opt == "adam-8bit":
        moments = adam8bit_bytes([*tensors, *saved_module_tensors(config, setup)])
    elif opt in PAGED_OPTIMIZERS:  # the allocator's part; the managed part is memlab.predict.memory.plan's paged_bytes
        moments = paged_optimizer_bytes([*tensors, *saved_module_tensors(config, setup)], opt)[0]
    elif opt == "sgd-momentum":
        moments = ADAPTER_BYTES * n_ad
    elif opt == "sgd":
        moments = 0
    else:
        raise SetupError(f"optimizer {opt!r} with finetune={setup.finetune!r} is not modelled: use adamw, adam, "
                         "adam-8bit, paged-adamw, paged-adam-8bit, sgd or sgd-momentum")
    saved = saved_module_elements(config, setup)  # peft modules_to_save: a trainable copy in the base's dtype
    sb = pb  # the copy of the head/embedding, in the base's dtype (16-bit over a bf16 QLoRA base)
    if saved:
        if opt not in ("adam-8bit", *PAGED_OPTIMIZERS):  # counted per tensor above (the maps shared once)
            moments += {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}[opt] * sb * saved
        notes.append(f"modules_to_save {', '.join(setup.lora_save_kinds)}: a trainable copy ({saved:,} weights, "
                     f"{sb} B each) beside the frozen original, with gradients and optimizer states in its dtype")
    n_tensors = len(tensors) + len(saved_module_tensors(config, setup))
    steps = 4 * n_tensors if opt in ("adam", "adamw") else 0
    detail = {"moments": moments, "master": 0, "grad_accum": 0, "step_counters": steps if step_on_device else 0}
    notes.append(f"LoRA rank {rank} on {', '.join(k for k, _, _ in mods)} of every block: {n_ad:,} trainable fp32 "
                 "adapter weights (peft autocast_adapter_dtype=True), their gradients and optimizer states")
    return {"params": base + ADAPTER_BYTES * n_ad + sb * saved, "grads": ADAPTER_BYTES * n_ad + sb * saved,
            "optimizer": sum(detail.values())}, detail, notes


_MODEL_LEVEL_ROWS = (RowName.TARGET_IDS, RowName.ROTARY, RowName.HEAD_INPUT,
                     RowName.LOG_SOFTMAX, RowName.LOSS_NORMALISER, RowName.HEAD_COPY)
"""Rows of :func:`memlab.predict.memory.activations.term_rows` that are not per block (besides the final norm's and the
embeddings' rows)."""


def frozen_trainable(config: TransformerConfig, setup: Any) -> list[int]:
    """Elements of each trainable tensor under ``finetune='frozen'``: all but the embeddings and the bottom
    ``setup.frozen_layers`` blocks. Tied embeddings, or no block left to train, raise :class:`ConfigError`."""
    n = setup.frozen_layers
    if n >= config.n_layers:
        raise ConfigError(f"frozen_layers={n} freezes every one of the model's {config.n_layers} blocks: leave at "
                          "least one to train")
    if config.tied_embeddings:
        raise ConfigError("finetune='frozen' with tied embeddings is not modelled (freezing the embedding freezes "
                          "the head it is tied to): use a model with an untied head")
    frozen = tuple(f"blocks.{i}." for i in range(n))
    return [math.prod(shape) for name, shape, comp in config.param_shapes()
            if comp not in ("embeddings", "positions") and not name.startswith(frozen)]


def frozen_states(config: TransformerConfig, setup: Any, n_all: int,
                  step_on_device: bool) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """(params, grads, optimizer) bytes under ``finetune='frozen'``, the optimizer detail and notes: every weight
    in the policy's dtype, gradients and torch.optim states (in the parameter dtype) for the trainable ones."""
    tensors = frozen_trainable(config, setup)
    n_tr, pol, opt = sum(tensors), setup.policy, setup.optimizer
    per = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}[opt] * pol.param_bytes
    steps = 4 * len(tensors) if opt in ("adam", "adamw") else 0
    detail = {"moments": per * n_tr, "master": 0, "grad_accum": 0, "step_counters": steps if step_on_device else 0}
    notes = [f"frozen: the embeddings and the bottom {setup.frozen_layers} of {config.n_layers} blocks frozen; "
             f"{n_tr:,} of {n_all:,} weights train (gradients and optimizer states for those only)"]
    return {"params": n_all * pol.param_bytes, "grads": n_tr * pol.grad_bytes,
            "optimizer": sum(detail.values())}, detail, notes


def frozen_rows(config: TransformerConfig, setup: Any, rows: list[tuple]) -> list[tuple]:
    """Full fine-tuning's rows under ``finetune='frozen'``: the frozen blocks keep nothing (neither their inputs nor
    their weights need a gradient), the first trained block's first RMSNorm keeps only ``weight * x_hat``'s
    ``x_hat`` (its input needs no gradient), the frozen embeddings keep no token ids. Under transformers'
    checkpointing (:func:`checkpointed_input_grad`) every block's input needs a gradient: every block keeps its
    input, and the block recomputed in backward (the largest, a trained one) saves as in full fine-tuning."""
    L, N = config.n_layers, setup.frozen_layers
    frozen_trainable(config, setup)  # checks frozen_layers and the tie
    im = config.impl
    n_norm_rows = L if im.shared_norm else 2 * L
    grad_in = checkpointed_input_grad(setup)
    out: list[tuple] = []
    for row in rows:
        name, category, count, width, sharded = row[:5]
        if name in (RowName.INPUT_IDS, RowName.POSITION_IDS) or (name == RowName.EMBEDDING_DROPOUT and not grad_in):
            continue
        if name in _MODEL_LEVEL_ROWS or name.startswith("final norm") or grad_in:
            out.append(row)
            continue
        count = count * (L - N) / L
        if name.startswith("block norm") and config.norm == "rmsnorm" and "x*rstd" not in name:
            per = count / (L - N) / (1 if (im.parallel_block and "input" in name) else n_norm_rows / L)
            count = count - per
        out.append((name, category, count, width, sharded))
    return out


def saved_module_tensors(config: TransformerConfig, setup: Any) -> list[int]:
    """Elements of each module peft trains in full (``setup.lora_save_kinds``): the LM head (V x h) and the token
    embedding (V x h). Tied embeddings raise :class:`ConfigError` (a trainable copy of one breaks the tie)."""
    kinds = setup.lora_save_kinds
    if kinds and config.tied_embeddings:
        raise ConfigError("lora_modules_to_save with tied embeddings is not modelled (a trainable copy of the head "
                          "or the embedding unties them): drop lora_modules_to_save for this model")
    return [config.vocab_size * config.d_model for _ in kinds]


def adapter_tensors(config: TransformerConfig, setup: Any) -> list[int]:
    """Elements of each adapter tensor (every block's A, ``r x in``, and B, ``out x r``, per adapted module)."""
    mods = lora_modules(config, setup.lora_target_kinds)
    rank = setup.lora_r
    return ([rank * i for _, i, _ in mods] + [o * rank for _, _, o in mods]) * config.n_layers


def saved_module_elements(config: TransformerConfig, setup: Any) -> int:
    """Elements of all modules peft trains in full (:func:`saved_module_tensors`)."""
    return sum(saved_module_tensors(config, setup))


def lora_layer_elements(config: TransformerConfig, setup: Any) -> int:
    """Adapter elements of one block (what one block's backward adds as gradients)."""
    return adapter_elements(config, setup.lora_r, setup.lora_target_kinds) // config.n_layers


def largest_adapter_elements(config: TransformerConfig, setup: Any) -> int:
    """Elements of the largest adapter tensor (A or B) in a block."""
    return max(max(setup.lora_r * i, o * setup.lora_r) for _, i, o in
               lora_modules(config, setup.lora_target_kinds))


def largest_matrix_elements(config: TransformerConfig) -> int:
    """Elements of the largest block matrix (what QLoRA dequantises at once): the MLP's or the QKV projection."""
    h, q, kv, f = config.d_model, config.q_dim, config.kv_dim, config.ffn
    qkv = h * (q + 2 * kv) if config.impl.fused_qkv else h * q
    return max(h * f, qkv, q * h)


_DROPPED_ROWS = (RowName.INPUT_IDS, RowName.POSITION_IDS, RowName.EMBEDDING_DROPOUT, RowName.HEAD_INPUT)
"""Rows a frozen base does not save: the embeddings' token and position ids (their weights need no gradient), the
embedding dropout's noise (nothing below it needs a gradient) and the frozen head's input."""
_PROJECTION_INPUTS = {"q/k/v projection input": "qkv", "output projection input": "o", "MLP input": "mlp"}
"""Full fine-tuning rows of a projection's input (saved for its weight gradient) and the input group they read."""


def _groups(targets: tuple[str, ...], fused: bool) -> dict[str, tuple[str, ...]]:
    """Adapted modules by the input they read: ``qkv`` (the attention norm's output), ``o``, ``mlp`` (the MLP
    norm's output) and ``down`` (the MLP's inner product)."""
    qkv = ("qkv",) if fused and any(k in targets for k in ("q", "k", "v")) else \
        tuple(k for k in ("q", "k", "v") if k in targets)
    return {"qkv": qkv, "o": tuple(k for k in ("o",) if k in targets),
            "mlp": tuple(k for k in ("gate", "up") if k in targets),
            "down": tuple(k for k in ("down",) if k in targets)}


def finetune_rows(config: TransformerConfig, setup: Any, w: dict[str, float], rows: list[tuple],
                  device_type: str, recompute: str = "none") -> list[tuple]:
    """The activation rows of full fine-tuning (``rows``, :func:`memlab.predict.memory.activations.term_rows` without
    recompute) turned into those of ``setup.finetune`` (lora or qlora): rows a frozen base does not save dropped,
    the bottom block's share of rows nothing there needs, and one row per adapter tensor (module docstring).
    ``w``: the policy's widths (:func:`memlab.predict.memory.activations.shared_widths`). ``finetune='frozen'``:
    :func:`frozen_rows`."""
    if setup.finetune == "frozen":
        return frozen_rows(config, setup, rows)
    targets, p, save = setup.lora_target_kinds, setup.lora_dropout, setup.lora_save_kinds
    embed = "embed" in save  # a trainable embedding: the bottom block's input needs a gradient, as above it
    grad_in = embed or checkpointed_input_grad(setup)  # ... as it does under transformers' checkpointing
    L, t, f = config.n_layers, setup.batch * setup.seq, config.ffn
    im = config.impl
    mods = {k: (i, o) for k, i, o in lora_modules(config, targets)}
    # all-linear on a non-gated MLP: the gate the model lacks is no target (lora_modules leaves it out)
    groups = _groups(tuple(k for k in targets if k in mods or (im.fused_qkv and k in ("q", "k", "v"))), im.fused_qkv)
    autocast = setup.policy.autocast
    # QLoRA under autocast (amp-fp16, T4s): bitsandbytes' Linear4bit.forward casts x to its compute dtype and the
    # product back to x's dtype (bitsandbytes 0.50 nn/modules.py, ``.to(inp_dtype)``), over an fp32 residual stream
    q4 = setup.finetune == "qlora" and autocast
    # The bottom block's input needs no gradient: what its modules need follows from which ones are adapted.
    gq = bool(groups["qkv"]) and (im.fused_qkv or "q" in targets)
    gk = bool(groups["qkv"]) and (im.fused_qkv or "k" in targets)
    gv = bool(groups["qkv"]) and (im.fused_qkv or "v" in targets)
    attn0 = gq or gk or gv or grad_in  # the attention's output needs a gradient
    resid0 = attn0 or bool(groups["o"])  # the residual after attention does
    norms0 = 0 if grad_in else (2 - resid0 if not im.shared_norm else 1)  # bottom-block norms that keep nothing
    if grad_in:
        gq = gk = gv = True  # for what the bottom block's attention core keeps
    n_norm_rows = L if im.shared_norm else 2 * L
    swiglu = config.mlp == "swiglu"
    relu = not swiglu and im.act(config.mlp) == "relu"  # ReLU keeps its output whatever reads it
    names = [row[0] for row in rows]
    pv_reads = next((n for n in names if n.startswith(("dropped probabilities", "16-bit copy of probabilities"))),
                    next((n for n in names if n.startswith("softmax probabilities")), ""))
    out: list[tuple] = []
    for row in rows:
        name, category, count, width, sharded = row[:5]
        kept = (name == RowName.INPUT_IDS and embed) or (name == RowName.EMBEDDING_DROPOUT and grad_in) or \
            (name == RowName.HEAD_INPUT and "head" in save)  # peft trains these modules in full
        if (name in _DROPPED_ROWS and not kept) or (config.norm == "rmsnorm" and "x*rstd" in name):
            continue  # frozen embeddings and head; a frozen RMSNorm weight's product keeps nothing
        group = _PROJECTION_INPUTS.get(name)
        kernel_out = group == "o" and setup.fused_attention and not im.copies_sdpa_output(setup.attention)
        if kernel_out:  # a fused SDPA kernel keeps its output, the output projection's input, for its own backward
            # (in the bottom block only if attention needs a gradient, or an o adapter keeps that same tensor)
            drop0 = not attn0 and not (groups["o"] and _shares(p, autocast, w["compute"]))
            out.append((name + " (= the kernel's output)", category, count - drop0 * count / L, width, sharded))
            continue
        if group is not None:
            continue  # a frozen Linear keeps its weight, not its input (bitsandbytes' MatMul4Bit: the packed weight)
        if name.startswith("block norm"):
            per = count / (L if (im.parallel_block and "input" in name) else n_norm_rows)
            d = 1 if (im.parallel_block and "input" in name) else norms0
            out.append((name, category, count - d * per, width, sharded))
            continue
        if category == "mlp" and "d_ff wide" in name and q4:  # Linear4bit hands back its input's (fp32) dtype
            name, width = name + f" ({w['residual']:g} B: Linear4bit's output in its input's dtype)", w["residual"]
        if category == "mlp" and "d_ff wide" in name:
            adapter_keeps = "down" in targets and _shares(p, autocast, w["compute"])  # whatever needs a gradient
            keeps_down = relu or adapter_keeps
            n_f = im.mlp_saved_tensors(config.mlp)
            before = n_f - (3 if swiglu else 1)  # the activation's own tensors besides its output
            steady = n_f - (not keeps_down)  # the down projection's input only where something keeps it
            bottom = steady
            if not resid0:  # the bottom block's MLP input needs no gradient: only the adapted paths keep tensors
                gate, up = "gate" in targets, "up" in targets
                if swiglu:  # silu keeps gate's output, the product keeps silu's output and up's output
                    bottom = gate * before + up + gate + (adapter_keeps or (relu and (gate or up)))
                else:
                    bottom = up * before + (adapter_keeps or (relu and up))
            out.append((name, category, (L - 1) * t * f * steady + t * f * bottom, width, sharded))
            continue
        if category in ("attention", "attention scores") and not name.startswith(("rotary", "output projection")):
            out.append((name, category, count - count / L * _bottom_drop(name, gq, gk, gv, pv_reads), width, sharded))
            continue
        if name == "16-bit copies of block weights" and q4:
            continue  # Linear4bit is no autocast op: it dequantises its NF4 weight itself (qlora_dequantised_weight)
        if name == "16-bit copies of block weights":
            # autocast's copy of a frozen weight is kept for its input's gradient: in the bottom block not for q, k,
            # v (their input needs none), nor for o / the MLP where nothing below them needs one.
            h, q_dim, kv = config.d_model, config.q_dim, config.kv_dim
            down_in = resid0 or bool(groups["mlp"])  # the down projection's input needs a gradient
            bottom = 0 if grad_in else h * (q_dim + 2 * kv) + (0 if attn0 else q_dim * h) \
                + (0 if resid0 else (2 if swiglu else 1) * h * f) + (0 if down_in else h * f)
            out.append((name, category, count - bottom, width, sharded))
            continue
        if name == "attention output dropout mask" and not attn0:
            out.append((name, category, count - count / L, width, sharded))
            continue
        out.append(row)
    if recompute != "full":  # under full recompute the adapters' tensors are a recomputed block's, saved then
        out += adapter_rows(config, setup, w, groups, mods, device_type)
    return out


def checkpointed_input_grad(setup: Any) -> bool:
    """Whether the embeddings' output needs a gradient over a frozen embedding: under ``recompute='full'``, as
    transformers checkpoints (``activation_checkpointing_enable`` calls ``enable_input_require_grads`` for every
    model whose main input is ``input_ids``, transformers 5 modeling_utils.py ``_activation_checkpointing_enable``;
    peft's ``PeftModel`` does the same for a checkpointed model, peft_model.py
    ``_prepare_model_for_gradient_checkpointing``), so the bottom block saves what the blocks above it save, and
    the embedding output, a leaf, gets a gradient at the end of backward."""
    return setup.recompute == "full"


def autocast_cache_bytes(config: TransformerConfig, setup: Any, blocks: float, biases: float) -> float:
    """Autocast's cast cache held until the forward ends, on a frozen base: autocast caches the 16-bit cast of a
    weight only when it is a leaf that requires a gradient (``cached_cast``, aten/src/ATen/autocast_mode.cpp:
    ``arg.is_leaf() && arg.requires_grad()``), so frozen weights and biases are cast anew at each use and nothing
    caches them. ``blocks`` and ``biases``: the full model's cached block-weight and block-bias copies (bytes,
    :func:`memlab.predict.memory.activations.autocast_block_copy_bytes` under full recompute, else 0, and
    ``autocast_bias_copy_bytes``). LoRA: the adapters' 16-bit copies under full recompute (without it they are
    saved, in the activations); frozen: the trained blocks' share."""
    if setup.finetune == "frozen":
        return (blocks + biases) * (config.n_layers - setup.frozen_layers) / config.n_layers
    return 2 * adapter_elements(config, setup.lora_r, setup.lora_target_kinds) if blocks else 0.0


def _shares(p: float, autocast: bool, in_width: float) -> bool:
    """Whether an adapter's ``A`` saves its module's input itself: no dropout and no cast (peft casts a 16-bit input
    to the fp32 adapter's dtype, ``LoraLayer._cast_input_dtype``; under autocast A's matmul casts it to bf16)."""
    return p == 0 and not autocast and in_width == 4


def _bottom_drop(name: str, gq: bool, gk: bool, gv: bool, pv_reads: str) -> float:
    """The share (0 or 1) of one block's attention-core row that the bottom block does not save: a fused kernel keeps
    all or nothing; QK^T keeps q for k's gradient and k for q's; the softmax (its output), its dropout (the mask)
    and PV (v) keep theirs when q or k needs a gradient; PV keeps the probabilities it multiplies (``pv_reads``, a
    row name) for v's gradient."""
    if name.startswith(("q, k, v", "log-sum-exp", "rest of the fused", "kernel output")):
        return 0.0 if (gq or gk or gv) else 1.0
    scores = gq or gk
    if name.startswith("q"):
        return 0.0 if gk else 1.0
    if name.startswith("k"):
        return 0.0 if gq else 1.0
    if name == pv_reads:
        return 0.0 if (gv or (scores and name.startswith("softmax"))) else 1.0
    return 0.0 if scores else 1.0


def adapter_rows(config: TransformerConfig, setup: Any, w: dict[str, float], groups: dict[str, tuple[str, ...]],
                 mods: dict[str, tuple[int, int]], device_type: str) -> list[tuple]:
    """Rows of what the adapters save, all blocks: each A's input (a copy per module where peft or autocast casts
    it, or dropout draws noise; otherwise the module's input once per input group), dropout's noise, each A's ``t x r``
    output, and under autocast the 16-bit copies of A and B."""
    L, t, r, p = config.n_layers, setup.batch * setup.seq, setup.lora_r, setup.lora_dropout
    autocast = setup.policy.autocast
    a_width = 2 if autocast else 4
    embed = "embed" in setup.lora_save_kinds or checkpointed_input_grad(setup)  # every input needs a gradient
    attn0 = bool(groups["qkv"]) or embed  # in the bottom block, whose input needs no gradient: which inputs need one
    needs0 = {"qkv": embed, "o": attn0, "mlp": attn0 or bool(groups["o"]),
              "down": attn0 or bool(groups["o"]) or bool(groups["mlp"])}
    out: list[tuple] = []
    for group, kinds in groups.items():
        if not kinds:
            continue
        width = w["residual"] if group in ("qkv", "mlp") else w["compute"]
        n_in = mods[kinds[0]][0]
        if _shares(p, autocast, width):
            kernel_out = group == "o" and setup.fused_attention and not config.impl.copies_sdpa_output(setup.attention)
            if group != "down" and not kernel_out:  # else a base row counts it (the MLP's, a fused attention
                # kernel's output)
                out.append((f"LoRA A input ({'/'.join(kinds)})", "lora", L * t * n_in, width, False))
            continue
        for kind in kinds:
            if p > 0:  # dropout's noise is kept for its input's gradient: not where that input needs none
                noise = 1 if device_type == "cuda" else 4  # drawn on the input peft cast to fp32
                out.append((f"LoRA dropout noise ({kind})", "lora", (L - (not needs0[group])) * t * n_in, noise,
                            False))
            out.append((f"LoRA A input, {'bf16' if autocast else 'fp32'} ({kind})", "lora", L * t * n_in,
                        a_width, False))
    for group, kinds in groups.items():
        for kind in kinds:
            i, o = mods[kind]
            out.append((f"LoRA A output ({kind})", "lora", L * t * r, a_width, False))
            if autocast:  # A's copy is kept for its input's gradient: not where that input needs none
                a_blocks = L - (not needs0[group])
                out.append((f"16-bit copies of LoRA A and B ({kind})", "autocast weight copies",
                            a_blocks * r * i + L * o * r, 2, False))
    return out
