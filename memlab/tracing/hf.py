"""Trace a Hugging Face Transformers causal LM built from its config (never a download): :func:`trace_hf`.

The model is ``transformers.AutoModelForCausalLM.from_config(config)`` built inside the fake mode under a
``torch.device("cpu")`` context, then traced by :func:`memlab.tracing.tracer.trace_step` under a memlab
:class:`~memlab.predict.spec.setup.Setup` (precision policy, optimizer and its implementation, attention, recompute).
The config comes from a ``config.json`` path, a ``PretrainedConfig``, or a family name with dimensions
(``hf_config("llama", hidden_size=4096, ...)``, ``transformers.AutoConfig.for_model``).

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
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.model.gpt import sdpa_backend
from memlab.model.hf import (
    apply_finetune,
    call_inputs,
    checkpoint_every,
    hf_config,
    import_transformers,
    pad_counts,
    quiet_logger,
    quiet_transformers,
)
from memlab.model.policies import torchtitan_op_context
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
    ``setup``.

    ``setup.attention``: ``eager`` is transformers' eager attention, the others its ``sdpa`` implementation pinned
    to that SDPA backend; ``recompute='full'`` is ``activation_checkpointing_enable`` (non-reentrant), on every
    ``recompute_every``-th layer only (:func:`memlab.model.hf.checkpoint_every`); ``op`` passes torchtitan's per-op
    policy to each layer's checkpoint (:func:`memlab.model.policies.torchtitan_op_context`); ``selective`` has no
    transformers equivalent; ``finetune='lora'`` wraps the model with peft
    (:func:`memlab.model.hf.apply_lora`; qlora also quantises the base to NF4 with bitsandbytes, on fake tensors
    through its fake kernels: :func:`memlab.model.hf.fake_params4bit`).
    ``force_unpacked``: see :func:`unpacked_batches`. One process only (``world_size`` 1: transformers models are
    not sharded here; :func:`~memlab.tracing.gpt.trace_gpt` traces FSDP2); ``device_type`` is ``"cpu"`` or
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
    cfg = hf_config(config)
    if setup.mode != "train":
        raise SetupError("trace_hf traces a training step: set mode='train' (traced inference runs for the reference "
                         "GPT: trace_gpt)")
    if setup.world_size > 1:
        raise SetupError(f"trace_hf traces one process, but world_size={setup.world_size} (ZeRO-{setup.zero_stage}): "
                         "a transformers model is not sharded here, so its trace would sit beside a sharded formula; "
                         "set world_size=1 (FSDP2 traces run for the reference GPT: trace_gpt, memlab trace --preset)")
    if setup.recompute == "selective":
        raise SetupError("transformers has no selective (attention-core) recompute: use recompute='none', 'full' or "
                         "'op'")
    impl, backend = _ATTENTION[setup.attention]
    padded = bool(padding_present(setup, setup.batch, setup.seq))
    check_call(setup, device_type)  # a padded batch under CUDA SDPA: which kernel takes its mask is not measured
    parts = setup_parts(setup, device_type=device_type)
    notes = list(parts.pop("notes"))
    notes.append(f"transformers {tf.__version__}, {cfg.model_type}, attn_implementation={impl}"
                 + (f" (SDPA backend {backend})" if backend else ""))
    if force_unpacked:
        notes.append("unpacked batch forced (no packed-sequence mask; without padding no mask: SDPA is_causal, "
                     "native GQA); valid only for batches without packed sequences")
    vocab = int(cfg.vocab_size)

    def model_fn() -> nn.Module:
        if progress is not None:
            progress(f"building {cfg.model_type} from its config (fake tensors)")
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=model_dtype(setup.policy))
        if setup.recompute in ("full", "op"):
            kwargs: dict[str, Any] = {"use_reentrant": False}
            if setup.recompute == "op":  # torchtitan's per-op policy inside each layer's checkpoint
                kwargs["context_fn"] = torchtitan_op_context
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            if setup.recompute_every > 1:  # torchtitan's layer policy: every k-th layer keeps its flag
                checkpoint_every(model, setup.recompute_every)
        _check_positions(model, cfg, setup.seq)
        if progress is not None:
            progress.watch_blocks(model)
        if setup.finetune != "full":  # peft wraps the model and moves its adapters (memlab.model.hf.apply_finetune)
            model = apply_finetune(model, setup)
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
        batch = {"input_ids": ids, "labels": labels}
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

        with sdpa_kernel(sdpa_backend(backend)):  # inside the step's autocast, as the forward runs it
            return one_loss(model, batch)

    ctx = unpacked_batches() if force_unpacked else contextlib.nullcontext()
    kernels = cpu_grouped_mm_dtypes() if device_type == "cpu" else contextlib.nullcontext()
    where = (lambda: progress.last) if progress is not None else (lambda: "no progress reported")
    hint = (f"{cfg.model_type}'s modelling code may loop over the tokens in Python on CPU (Mamba's recurrent scan "
            "does, once per token per block): trace a shorter seq or fewer layers, or allow more time")
    try:
        with ctx, kernels, quiet_transformers(), _quiet_fake_tensor_log(), time_bound(timeout, where, hint):
            return trace_step(model_fn, batch_fn, parts["step_fn"], loss_fn=loss_fn, fake=fake,
                              name=name or f"hf:{cfg.model_type}", setup=setup.to_dict(), notes=tuple(notes))
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
    except (ValueError, TypeError, IndexError) as exc:
        _raise_if_the_models_code(exc, cfg.model_type)
        raise


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
