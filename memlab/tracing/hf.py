"""Trace a Hugging Face Transformers model built from its config (never a download): :func:`trace_hf`.

The model is ``transformers.AutoModelForCausalLM.from_config(config)`` (or the auto class of ``Setup.task``'s head:
:mod:`memlab.model.tasks`) built inside the fake mode under a ``torch.device("cpu")`` context, then traced by
:func:`memlab.tracing.tracer.trace_step` under a memlab :class:`~memlab.predict.spec.setup.Setup` (precision
policy, optimizer and its implementation, attention, recompute). The config comes from a ``config.json`` path, a
``PretrainedConfig``, or a family name with dimensions (``hf_config("llama", hidden_size=4096, ...)``,
``transformers.AutoConfig.for_model``).

Found when this was built (transformers 5.x): transformers treats a FakeTensor as "tracing"
(``transformers.utils.import_utils.is_tracing``, [transformers-masking]) and then builds an explicit attention
mask from the position ids (``masking_utils.find_packed_sequence_indices``), so SDPA gets a mask and, for GQA,
``repeat_kv`` copies: more saved bytes than the real run. :func:`unpacked_batches` forces the path a real
unpacked batch takes (without padding no mask: ``is_causal`` and native GQA); it is valid only for batches without
packed sequences, and every trace says so in its notes. An all-ones mask is traced as the call without one (which
saves the same), a padded batch with its mask handed to the model: "tracing" there makes transformers build the
4-D mask, which it builds for real for any batch with padding, and no other mask value is read (both measured equal
to real CPU steps by ``benchmarks/hf_draws.py``). On CPU an fp32 or fp16 ``grouped_mm`` traces as the CPU kernel
runs it (:func:`cpu_grouped_mm_dtypes`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError, SetupError
from memlab.model.gpt import sdpa_backend
from memlab.model.hf import (
    apply_finetune,
    call_inputs,
    checkpoint_every,
    enable_checkpointing,
    hf_config,
    import_transformers,
    pad_counts,
    quiet_logger,
    quiet_transformers,
)
from memlab.model.policies import torchtitan_op_context
from memlab.model.tasks import TASKS, resolve_task, task_labels
from memlab.predict.memory.family_terms import check_call, padding_present
from memlab.predict.spec.setup import Setup
from memlab.predict.spec.validate import check_bool
from memlab.tracing.arguments import check_trace_setup
from memlab.tracing.gpt import setup_parts
from memlab.tracing.progress import Progress, time_bound
from memlab.tracing.tracer import Trace, default_loss, trace_step

_ATTENTION = {"eager": ("eager", None), "math": ("sdpa", "math"), "flash": ("sdpa", "flash"),
              "efficient": ("sdpa", "efficient"), "cudnn": ("sdpa", "cudnn")}


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """Make transformers take the unpacked path on fake tensors (module docstring): the packed-sequence
    detection returns None, as it does for a real batch of consecutive position ids."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextlib.contextmanager
def cpu_grouped_mm_dtypes() -> Iterator[None]:
    """Let torch's fake-tensor kernel for ``grouped_mm`` take fp32 and fp16 inputs, as its CPU kernel does.

    ``torch._meta_registrations._meta_grouped_mm_common`` copies the CUDA kernel's checks, bf16 inputs only, but
    the CPU kernel (torch 2.13) multiplies fp32 and fp16 experts too (measured: a transformers MoE model in fp32
    trains on a CPU), so a CPU trace of such a step would be refused for a check the real kernel does not make.
    Inside this context an unscaled ``grouped_mm`` of two fp32 or two fp16 inputs is checked as the CPU kernel
    checks it (2D or 3D, matching contraction, row strides multiples of 16 bytes: it raises "strides should be
    multiple of 16 bytes" otherwise) and gets torch's own output allocation
    (``_create_grouped_mm_output_tensor``) in the inputs' dtype; everything else goes to the original."""
    from torch import _meta_registrations as meta

    original = meta._meta_grouped_mm_common

    def common(mat_a: torch.Tensor, mat_b: torch.Tensor, scale_a: Any, scale_b: Any, offs: Any = None,
               bias: Any = None, scale_result: Any = None, out_dtype: Any = None, use_fast_accum: bool = False) -> Any:
        if scale_a is not None or scale_b is not None or bias is not None or mat_a.dtype != mat_b.dtype \
                or mat_a.dtype not in (torch.float32, torch.float16):
            return original(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)
        align = 16 // mat_a.element_size()
        for mat in (mat_a, mat_b):
            torch._check(mat.dim() in (2, 3), lambda: "grouped_mm multiplicands must be 2D or 3D")
            rows = mat.stride()[-2:]
            torch._check(min(rows) == 1 and max(rows) % align == 0, lambda: "strides should be multiple of 16 bytes")
        if mat_a.dim() == 3 or mat_b.dim() == 3:
            torch._check(mat_a.size(-1) == mat_b.size(-2), lambda: "contraction dimensions must match")
        return meta._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)

    meta._meta_grouped_mm_common = common
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = original


def trace_hf(config: Any, setup: Setup, *, fake: bool = True, device_type: str = "cuda",
             force_unpacked: bool = True, name: str | None = None, progress: Progress | None = None,
             timeout: float | None = None) -> Trace:
    """:func:`memlab.tracing.tracer.trace_step` of ``AutoModelForCausalLM.from_config(hf_config(config))`` under
    ``setup``; ``setup.task`` picks another head (``auto``: the one the config's ``architectures`` names, else the
    causal LM; :func:`memlab.model.tasks.resolve_task`), called with its labels and its own loss
    (:func:`memlab.model.tasks.task_labels`; a chunked or fused loss and LoRA are the causal LM's only).

    ``setup.attention``: ``eager`` is transformers' eager attention, the others its ``sdpa`` implementation pinned
    to that SDPA backend; ``recompute='full'`` is ``activation_checkpointing_enable`` (non-reentrant; with
    ``setup.checkpoint_reentrant`` torch's reentrant checkpoint, as peft's kbit preparation leaves it), on every
    ``recompute_every``-th layer only (:func:`memlab.model.hf.checkpoint_every`); ``op`` passes torchtitan's per-op
    policy to each layer's checkpoint (:func:`memlab.model.policies.torchtitan_op_context`); ``selective`` has no
    transformers equivalent; ``finetune='lora'`` wraps the model with peft
    (:func:`memlab.model.hf.apply_lora`; qlora also quantises the base to NF4 with bitsandbytes, on fake tensors
    through its fake kernels: :func:`memlab.model.hf.fake_params4bit`).
    ``world_size`` > 1 with ``zero_stage`` 2 or 3: FSDP2 over a fake process group, every decoder layer a unit,
    then the root (:func:`_fsdp2`), rank 0's bytes; QLoRA there as the FSDP-QLoRA recipe runs it [answerai2024]:
    the packed weights in bf16 storage (:func:`memlab.model.hf.quant_storage_of`), sharded with the unit's other
    parameters, bitsandbytes' quantisation state on every rank (:func:`memlab.model.hf.restore_quant_state`).
    ``force_unpacked``: see :func:`unpacked_batches`. ``device_type`` is ``"cpu"`` or
    ``"cuda"``. A ``seq`` longer than a learned position table (GPT-2's ``n_positions``, OPT's
    ``max_position_embeddings``) raises :class:`SetupError`: on fake tensors the lookup past the table would pass
    unnoticed. transformers' warnings are silenced while the step is traced. ``progress`` (a
    :class:`~memlab.tracing.progress.Progress`) reports the build and each block's forward; ``timeout`` (seconds,
    None: none) stops the trace with a one-line :class:`~memlab.tracing.progress.TraceTimeout`.
    """
    tf = import_transformers()
    from memlab.model.loss import LossOptions, hf_causal_lm_loss
    from memlab.model.step import model_dtype

    check_trace_setup(setup, device_type, fake)
    check_bool("force_unpacked", force_unpacked, err=SetupError)
    if name is not None and not isinstance(name, str):
        raise SetupError(f"name must be a string or None, got {type(name).__name__}")
    cfg = hf_config(config, task=setup.task)
    task = resolve_task(cfg, setup.task)
    if setup.mode != "train":
        raise SetupError("trace_hf traces a training step: set mode='train' (traced inference runs for the reference "
                         "GPT: trace_gpt)")
    if setup.world_size > 1 and setup.finetune == "qlora" and setup.fsdp_param_dtype not in ("none", "bf16"):
        raise SetupError(f"QLoRA under FSDP2 with fsdp_param_dtype={setup.fsdp_param_dtype!r}: MixedPrecisionPolicy "
                         "would cast the bf16-stored 4-bit weights as numbers for the all-gather (their bits are "
                         "packed NF4, not bf16 values): use fsdp_param_dtype 'none' or 'bf16'")
    mesh: list[Any] = []  # FSDP2's fake device mesh, once the fake process group exists (world_size > 1)
    if setup.recompute == "selective":
        raise SetupError("transformers has no selective (attention-core) recompute: use recompute='none', 'full' or "
                         "'op'")
    head_notes: list[str] = []
    head = _task_head(tf, task, setup, head_notes)
    auto = None
    if setup.attention == "auto":  # the library's choice: transformers' implementation, torch's kernel
        setup, auto = hf_library_attention(tf, cfg, setup, device_type, head)
    impl, backend = _ATTENTION[setup.attention]
    padded = bool(padding_present(setup, setup.batch, setup.seq))
    check_call(setup, device_type)  # a padded batch under CUDA SDPA: which kernel takes its mask is not measured
    parts = setup_parts(setup, device_type=device_type)
    notes = list(parts.pop("notes")) + ([auto] if auto else [])
    notes.append(f"transformers {tf.__version__}, {cfg.model_type}, attn_implementation={impl}"
                 + (f" (SDPA backend {backend})" if backend else ""))
    notes += head_notes
    heads, kv_heads = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if backend == "efficient" and fake and device_type == "cuda" and kv_heads and heads and kv_heads < heads:
        notes.append("memory-efficient kernel with grouped K/V heads: its op's fake backward takes the query's heads, "
                     "so K/V are repeated to them inside the attention's backward (a transient a CUDA run may not "
                     "make: an upper bound there); what the kernel saves is CUDA's")
    if setup.checkpoint_reentrant:
        notes.append("checkpointing: torch's reentrant CheckpointFunction (use_reentrant=True), as peft's "
                     "prepare_model_for_kbit_training alone leaves it; each checkpoint's function dropped when "
                     "backward ends, as the real step frees it with its graph (release_reentrant_calls)")
    if force_unpacked:
        notes.append("unpacked batch forced (no packed-sequence mask; without padding no mask: SDPA is_causal in a "
                     "causal LM, native GQA); valid only for batches without packed sequences")
    vocab = int(cfg.vocab_size)

    def model_fn() -> nn.Module:
        if progress is not None:
            progress(f"building {cfg.model_type} from its config (fake tensors)")
        model = head.from_config(cfg, attn_implementation=impl, dtype=model_dtype(setup.policy))
        if setup.recompute in ("full", "op"):  # op: torchtitan's per-op policy inside each layer's checkpoint
            enable_checkpointing(model, reentrant=setup.checkpoint_reentrant,
                                 context_fn=torchtitan_op_context if setup.recompute == "op" else None)
            if setup.recompute_every > 1:  # torchtitan's layer policy: every k-th layer keeps its flag
                checkpoint_every(model, setup.recompute_every)
        _check_positions(model, cfg, setup.seq)
        if progress is not None:
            progress.watch_blocks(model)
        if setup.finetune != "full":  # peft wraps the model and moves its adapters (memlab.model.hf.apply_finetune)
            model = apply_finetune(model, setup)
        if mesh and fake and setup.finetune == "qlora":  # bitsandbytes' fix-up after FSDP swaps the weight
            from memlab.model.hf import restore_quant_state

            restore_quant_state(model)
        if mesh:  # FSDP2: every decoder layer a unit, then the root (memlab.model.fsdp.shard_model's blocks plan)
            from memlab.model.fsdp import shard_model

            shard_model(model, zero_stage=setup.zero_stage, param_dtype=setup.fsdp_param_dtype,
                        reduce_dtype=setup.fsdp_reduce_dtype, mesh=mesh[0], offload=setup.fsdp_offload,
                        reshard_root=setup.fsdp_reshard_root, pin_memory=False)
        if setup.recompute in ("full", "op"):
            release_leaf_inputs(model.get_input_embeddings())
        if setup.checkpoint_reentrant:
            release_reentrant_calls(model)
        model.train()
        return model

    if padded:
        n_pad = sum(pad_counts(setup.batch, setup.seq, setup.pad_fraction))
        notes.append(f"padded batch ({n_pad} padding tokens, {setup.padding_side}): its 0/1 mask "
                     "handed to the model, where transformers takes a fake mask for tracing and builds the 4-D mask "
                     "it builds for any batch with padding (masking_utils._ignore_causal_mask_sdpa); no other value "
                     "is read (measured equal to real CPU steps: benchmarks/hf_draws.py, verdict 'traced')")
    elif setup.attention_mask != "none":
        notes.append("attention_mask='ones': traced as the call without a mask, which saves the same (transformers "
                     "builds no mask for SDPA and the same causal mask for eager; measured on every tiny HF config, "
                     "benchmarks/call_conventions.py), with the loop's all-ones int64 mask held beside the token ids")

    def batch_fn() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (setup.batch, setup.seq))
        labels, mask = call_inputs(ids, setup.attention_mask, setup.pad_fraction, setup.padding_side)
        batch = {"input_ids": ids, "labels": labels} if task == "causal-lm" else {
            "input_ids": ids, **task_labels(cfg, task, ids)}
        if mask is not None:
            batch["attention_mask"] = mask
        return batch

    options = LossOptions.of(setup)

    def one_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not padded:  # an all-ones mask is held by the loop, not handed to the model (notes)
            batch = {k: v for k, v in batch.items() if k != "attention_mask"}
        if options == LossOptions():
            return default_loss(model, batch)
        return hf_causal_lm_loss(model, batch["input_ids"], batch["labels"], options, batch.get("attention_mask"))

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not backend:
            return one_loss(model, batch)
        from torch.nn.attention import sdpa_kernel

        kernel = cuda_efficient_on_fake() if backend == "efficient" and fake and device_type == "cuda" \
            else sdpa_kernel(sdpa_backend(backend))
        with kernel:  # inside the step's autocast, as the forward runs it
            return one_loss(model, batch)

    ctx = unpacked_batches() if force_unpacked else contextlib.nullcontext()
    kernels = cpu_grouped_mm_dtypes() if device_type == "cpu" else contextlib.nullcontext()
    if backend and setup.recompute in ("full", "op"):  # the checkpoint recomputes each block in backward, outside the
        # forward's context: pinned there too, or SDPA dispatches another kernel and the recomputed tensors differ
        # (torch.utils.checkpoint.CheckpointError)
        from torch.nn.attention import sdpa_kernel

        kernels = _both(kernels, cuda_efficient_on_fake() if backend == "efficient" and fake and device_type == "cuda"
                        else sdpa_kernel(sdpa_backend(backend)))
    where = (lambda: progress.last) if progress is not None else (lambda: "no progress reported")
    hint = (f"{cfg.model_type}'s modelling code may loop over the tokens in Python on CPU (Mamba's recurrent scan "
            "does, once per token per block): trace a shorter seq or fewer layers, or allow more time")
    sharded, unreliable = _fsdp2(setup, notes, fake)
    try:
        with sharded as group, ctx, kernels, quiet_transformers(), _quiet_fake_tensor_log(), \
                time_bound(timeout, where, hint):
            mesh.extend([group] if group is not None else [])
            return trace_step(model_fn, batch_fn, parts["step_fn"], loss_fn=loss_fn, fake=fake,
                              name=name or f"hf:{cfg.model_type}" + ("" if task == "causal-lm" else f":{task}"),
                              setup=setup.to_dict(), notes=tuple(notes), unreliable=unreliable)
    except RuntimeError as exc:
        if "Expected inputs of BF16 type" in str(exc):  # torch/_meta_registrations.py _meta_grouped_mm_common
            raise SetupError(f"{cfg.model_type}: its grouped_mm experts are not bf16 here (an fp32 or fp16 model, or "
                             "under autocast, where no autocast rule casts them), and on CUDA grouped_mm takes bf16 "
                             "inputs only (its fake-tensor kernel too: torch/_meta_registrations.py "
                             "_meta_grouped_mm_common): trace a bf16 model (precision 'bf16'), or this step for a "
                             "CPU (device_type='cpu', whose kernel takes fp32 and fp16)") from None
        if "No available kernel" not in str(exc) and "No viable backend" not in str(exc):
            _raise_if_the_models_code(exc, cfg.model_type)
            raise
        raise SetupError(f"SDPA backend {backend!r} cannot run this model on CPU, where traces run (the efficient "
                         "kernel has no CPU version; CPU flash has no dropout in training and no mask): set the "
                         "config's dropout to 0 or use attention='math' or 'eager'") from None
    except MemlabError:
        raise  # memlab's own refusal (a kernel it does not imitate, a bad setup), not the model's code
    except (ValueError, TypeError, IndexError) as exc:
        _raise_if_the_models_code(exc, cfg.model_type)
        raise


@contextlib.contextmanager
def cuda_efficient_on_fake() -> Iterator[None]:
    """SDPA as CUDA runs its memory-efficient backend, on fake tensors: torch's CPU dispatch never picks that kernel
    (it has no CPU version), but its op has a fake (meta) kernel, so the call torch makes on CUDA is made directly:
    ``aten._scaled_dot_product_efficient_attention(q, k, v, mask, compute_log_sumexp, dropout_p, is_causal, scale)``
    with the log-sum-exp when an input needs a gradient (aten/src/ATen/native/transformers/attention.cpp
    ``scaled_dot_product_attention``, case efficient_attention). An explicit mask is refused (CUDA pads and expands
    it first, ``preprocess_mask``, not imitated here). Grouped K/V heads go in as they are (sdp_utils.cpp lets the
    CUDA kernel take them); their backward runs through :class:`_EfficientGqa`. Under autocast q, k and v are cast to
    its dtype first, as autocast casts ``scaled_dot_product_attention``'s inputs (a ``lower_precision_fp`` op:
    aten/src/ATen/autocast_mode.cpp) before the kernel is chosen; the op called directly is in no autocast list, so
    without the cast an fp32 rotated q and k (the fp32 cos and sin promote them) would reach it, and its output,
    uncast."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def efficient(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> torch.Tensor:
        if attn_mask is not None:
            raise SetupError("the memory-efficient kernel with an explicit mask is not traced (CUDA pads and expands "
                             "the mask first): use attention='eager' or 'math' for this call (the formula answers "
                             "'efficient')")
        if torch.is_autocast_enabled(query.device.type):
            low = torch.get_autocast_dtype(query.device.type)
            query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if key.shape[-3] != query.shape[-3] and grad:
            return _EfficientGqa.apply(query, key, value, dropout_p, is_causal, scale)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, None, grad, dropout_p, is_causal, scale=scale)[0]

    F.scaled_dot_product_attention = efficient
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _EfficientGqa(torch.autograd.Function):
    """The memory-efficient kernel with grouped K/V heads on fake tensors. Forward: the op CUDA runs, K and V as they
    are, saving what it saves (q, k, v, the output, the log-sum-exp, the RNG seed and offset). Backward: the op's fake
    kernel returns K/V gradients with the query's heads, so K and V are repeated to the query's heads for it and the
    gradients summed back per group: transients (2 x the repeated K/V and their gradients) a CUDA backward may not
    make, an upper bound inside the attention's backward, said in the trace's notes."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float,
                is_causal: bool, scale: float | None) -> torch.Tensor:
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, None, True, dropout_p, is_causal, scale=scale)
        ctx.save_for_backward(query, key, value, out, lse, seed, offset)
        ctx.args = (dropout_p, is_causal, scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        query, key, value, out, lse, seed, offset = ctx.saved_tensors
        dropout_p, is_causal, scale = ctx.args
        b, hk, s, d = key.shape
        rep = query.shape[-3] // hk
        gq, gk, gv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad, query, key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3), None, out, lse, seed,
            offset, dropout_p, [True, True, True, False], is_causal, scale=scale)
        return (gq, gk.view(b, hk, rep, s, d).sum(2), gv.view(b, hk, rep, s, value.shape[-1]).sum(2), None, None,
                None)


def hf_library_attention(tf: Any, cfg: Any, setup: Setup, device_type: str,
                         auto_class: Any = None) -> tuple[Setup, str]:
    """``setup`` with ``attention='auto'`` replaced by what the libraries run for ``cfg`` (a transformers config):
    eager where its model class does not support SDPA (``_supports_sdpa``), else the kernel torch dispatches
    (:mod:`memlab.predict.spec.kernels`) for its head dim, attention dropout and a padded batch's mask; and why.
    ``auto_class``: the task's auto class (its model class is the one asked; default the causal LM's)."""
    from memlab.predict.spec.kernels import sdpa_kernel

    cls = (auto_class or tf.AutoModelForCausalLM)._model_mapping.get(type(cfg), None)  # the head's class
    if cls is not None and not getattr(cls, "_supports_sdpa", False):
        return setup.with_(attention="eager"), f"attention eager: transformers builds {cfg.model_type} eager (its " \
                                               "class does not support SDPA)"
    heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(cfg, "head_dim", None) or int(getattr(cfg, "hidden_size", heads)) // heads)
    dropout = float(getattr(cfg, "attention_dropout", None) or getattr(cfg, "attn_pdrop", None) or 0.0)
    mask = setup.attention_mask == "padded"
    kernel, why = sdpa_kernel(device_type=device_type, dtype=setup.policy.compute_dtype, head_dim=head_dim,
                              mask=mask, dropout=dropout)
    return setup.with_(attention=kernel), f"attention {kernel}: transformers' default sdpa -> {why}"


def _fsdp2(setup: Setup, notes: list[str], fake: bool) -> tuple[Any, tuple[tuple[str, str], ...]]:
    """(the fake process group's context, the phases a fake trace cannot count) of ``setup``: FSDP2 over
    ``world_size`` > 1 ranks (:mod:`memlab.tracing.fake_dist`, as :func:`~memlab.tracing.gpt.trace_gpt` runs the
    reference GPT), its note added; a null context and none for one process."""
    if setup.world_size == 1:
        return contextlib.nullcontext(), ()
    from memlab.tracing.fake_dist import fake_process_group

    notes.append(f"FSDP2 over a fake {setup.world_size}-rank process group (ZeRO-{setup.zero_stage}: every decoder "
                 "layer a unit, then the root): rank 0's bytes, gathered layers included, no communication; on fake "
                 "tensors the first optimizer step also counts DTensor's first sharding propagation: marked "
                 "unreliable, the steady step is exact")
    if setup.finetune == "qlora":
        notes.append("QLoRA under FSDP2 as the FSDP-QLoRA recipe runs it [answerai2024]: the packed 4-bit weights "
                     "stored as bf16 (bnb_4bit_quant_storage) and sharded with each unit's norms and adapters (FSDP2 "
                     "all-gathers a unit of mixed dtypes as bytes); bitsandbytes' quantisation state (absmax, nested "
                     "absmax, codes, offsets) is no parameter: every rank holds all of it; a gathered weight is "
                     "dequantised to bf16 in backward (traced) and on CUDA by the forward's gemm_4bit too wherever "
                     "bitsandbytes picks dequantise-then-linear (always past 1536 tokens: 0.50 backends/cuda/ops.py; "
                     "one weight at a time, the formula's qlora_dequantised_weight; the fake kernel makes only the "
                     "output); the recipe's "
                     "FSDP1 flat parameters (one padded buffer per unit) are not traced, FSDP2's per-parameter "
                     "shards are")
    return fake_process_group(setup.world_size), ((("first", "optimizer step"),) if fake else ())


def _task_head(tf: Any, task: str, setup: Setup, notes: list[str]) -> Any:
    """The auto class of ``task`` (:data:`memlab.model.tasks.TASKS`), with a note of its labels and loss; a chunked
    or fused loss, kept positions or LoRA under another head than the causal LM's raise :class:`SetupError`."""
    if task == "causal-lm":
        return tf.AutoModelForCausalLM
    if setup.loss != "plain" or setup.logits_to_keep or setup.loss_call != "labels":
        raise SetupError(f"task={task!r} computes transformers' own {task} loss from labels: a chunked or fused loss, "
                         "logits_to_keep and loss_call='manual' are the causal LM's; leave them at their defaults")
    if setup.finetune in ("lora", "qlora"):
        raise SetupError(f"finetune={setup.finetune!r} with task={task!r} is not traced (peft adapts the causal LM's "
                         "modules here; a head would be a module to save): use finetune='full' or 'frozen'")
    row = TASKS[task]
    notes.append(f"task {task}: transformers.{row.auto}; {row.labels}; loss: {row.loss}")
    return getattr(tf, row.auto)


@contextlib.contextmanager
def _both(first: contextlib.AbstractContextManager[Any], second: contextlib.AbstractContextManager[Any]
          ) -> Iterator[None]:
    """Two contexts entered in order, as one."""
    with first, second:
        yield


def release_leaf_inputs(embedding: nn.Module | None) -> None:
    """Free a leaf embedding output when its backward ends, as a step without a tracker frees it.

    Under checkpointing transformers makes the input embeddings' output require a gradient
    (``enable_input_require_grads``, which ``activation_checkpointing_enable`` calls): over a frozen embedding
    (LoRA, QLoRA, frozen layers) that output is a leaf, and its gradient is accumulated into its ``.grad``. torch's
    ``ModTracker`` (inside the tracer's ``MemTracker``) hooks every module's inputs with
    ``register_multi_grad_hook(mode='all')``, whose closure holds the input's autograd node while the hook sits on
    that node: cycles through C++ that garbage collection cannot break, and they reach the leaf's gradient
    accumulator, so the trace kept the leaf and its gradient (2 x t x h) for every step, which a real step frees
    with its graph (measured: :func:`memlab.run.hf.run_hf` frees them; the same step under ``ModTracker`` did not).
    Here a callback the autograd engine runs when the backward ends drops the leaf's gradient and storage (what
    the real step frees when the loss goes, later in the same phase); no other byte changes."""
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if not (isinstance(output, torch.Tensor) and output.is_leaf and output.requires_grad):
            return
        ref = weakref.ref(output)

        def release() -> None:
            leaf = ref()
            if leaf is not None:
                leaf.grad = None
                leaf.data = leaf.data.new_empty(0)

        output.register_hook(lambda grad: torch.autograd.Variable._execution_engine.queue_callback(release))

    if embedding is not None:
        embedding.register_forward_hook(hook)


def release_reentrant_calls(model: nn.Module) -> None:
    """Free what each reentrant checkpoint's function holds when the backward ends, as a step without a tracker
    frees it.

    transformers checkpoints ``partial(forward, layer, **kwargs)`` with the layer's positional inputs
    (modeling_layers.py ``GradientCheckpointingLayer``), and torch's reentrant ``CheckpointFunction`` keeps that
    function on its autograd context (``ctx.run_function``) for the recompute: the keyword tensors (rotary cos/sin,
    the causal mask, the position ids) live as long as the node does. A real step frees the node with its graph,
    when the loss goes (measured: :func:`memlab.run.hf.run_hf` ends its backward with the bytes of the
    non-reentrant step); under the tracer's ``ModTracker`` the node sits in the reference cycles
    :func:`release_leaf_inputs` describes, so the trace kept them for every step (12,544 B a step on the tiny
    Llama). Here each layer's checkpoint function is wrapped so that its recompute (the call under grad, inside
    backward) queues a callback the autograd engine runs when the backward ends, which drops the function; no other
    byte changes."""
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if func is not None:
            module._gradient_checkpointing_func = _released(func)


def _released(checkpoint_func: Any) -> Any:
    """``checkpoint_func`` with its function dropped when the backward that recomputed it ends."""
    def released(function: Any, *args: Any, **kwargs: Any) -> Any:
        holder = [function]

        def run(*inner: Any) -> Any:
            call = holder[0]
            if torch.is_grad_enabled():  # the recompute inside backward (the forward runs under no_grad)
                torch.autograd.Variable._execution_engine.queue_callback(holder.clear)
            return call(*inner)

        return checkpoint_func(run, *args, **kwargs)

    return released


def _quiet_fake_tensor_log() -> contextlib.AbstractContextManager[None]:
    """torch's fake-tensor logger at CRITICAL while a step is traced: it logs every failing meta kernel with its
    traceback (``log.exception`` in torch/_subclasses/fake_tensor.py) before re-raising, and the error itself
    reaches the caller (as one line where it is the model's: :func:`_raise_if_the_models_code`)."""
    import logging

    return quiet_logger("torch._subclasses.fake_tensor", logging.CRITICAL)


def _raise_if_the_models_code(exc: BaseException, model_type: str) -> None:
    """A one-line :class:`SetupError` when ``exc`` was raised inside transformers' modelling code (its deepest
    frame from transformers is a ``modeling_*.py`` or its shared layers): the config is one that code cannot run
    (e.g. a ``head_dim`` that does not fit ``hidden_size``), and a real run fails the same way. Anything else
    (memlab's own code, torch alone) is left to propagate."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/transformers/" in f.filename.replace("\\", "/")]
    if not frames:
        return
    last = frames[-1]
    where = f"{last.filename.replace(chr(92), '/').split('/transformers/')[-1]}:{last.lineno}"
    message = " ".join(str(exc).split())[:300]
    raise SetupError(f"transformers' {model_type} code cannot run this config ({type(exc).__name__} at "
                     f"transformers/{where}: {message}); a real run fails the same way: check the config's sizes "
                     "(hidden_size, num_attention_heads, head_dim, intermediate_size)") from None


_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")
"""Names transformers gives a learned position table (GPT-2 and GPT-Neo ``wpe``, OPT and BioGPT
``embed_positions``, ``position_embeddings`` elsewhere)."""


def _check_positions(model: nn.Module, cfg: Any, seq: int) -> None:
    """Raise :class:`SetupError` when ``seq`` tokens index past ``model``'s learned position table: an
    ``nn.Embedding`` named as in :data:`_POSITION_TABLES`, of ``num_embeddings`` rows less its ``offset`` (OPT's 2).
    Rotary and ALiBi models have no table and run any length."""
    for qualified, module in model.named_modules():
        if qualified.rpartition(".")[2] in _POSITION_TABLES and isinstance(module, nn.Embedding):
            rows = module.num_embeddings - int(getattr(module, "offset", 0) or 0)
            if seq > rows:
                limit = getattr(cfg, "max_position_embeddings", rows)
                raise SetupError(f"seq={seq} is longer than the {cfg.model_type} model's learned position table "
                                 f"({rows} positions: max_position_embeddings={limit}): lower seq to at most {rows} "
                                 "or raise max_position_embeddings in the config")
