"""Trace a Hugging Face Transformers causal LM built from its config (never a download): :func:`trace_hf`.

The model is ``transformers.AutoModelForCausalLM.from_config(config)`` built inside the fake mode under a
``torch.device("cpu")`` context, then traced by :func:`memlab.tracing.tracer.trace_step` under a memlab
:class:`~memlab.predict.setup.Setup` (precision policy, optimizer and its implementation, attention, recompute).
The config comes from a ``config.json`` path, a ``PretrainedConfig``, or a family name with dimensions
(``hf_config("llama", hidden_size=4096, ...)``, ``transformers.AutoConfig.for_model``).

Found when this was built (transformers 5.x): transformers treats a FakeTensor as "tracing"
(``transformers.utils.import_utils.is_tracing``, [transformers-masking]) and then builds an explicit attention
mask from the position ids (``masking_utils.find_packed_sequence_indices``), so SDPA gets a mask and, for GQA,
``repeat_kv`` copies: more saved bytes than the real run. :func:`unpacked_batches` forces the path a real
unpadded, unpacked batch takes (no mask: ``is_causal`` and native GQA); it is valid only for unpadded batches
without packed sequences, and every trace says so in its notes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.model.gpt import sdpa_backend
from memlab.model.hf import apply_finetune, hf_config, import_transformers, quiet_logger, quiet_transformers
from memlab.predict.setup import Setup
from memlab.predict.validate import check_bool
from memlab.tracing.arguments import check_trace_setup
from memlab.tracing.gpt import setup_parts
from memlab.tracing.progress import Progress, time_bound
from memlab.tracing.tracer import Trace, default_loss, trace_step

_ATTENTION = {"eager": ("eager", None), "math": ("sdpa", "math"), "flash": ("sdpa", "flash"),
              "efficient": ("sdpa", "efficient"), "cudnn": ("sdpa", "cudnn")}


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """Make transformers take the unpadded, unpacked path on fake tensors (module docstring): the packed-sequence
    detection returns None, as it does for a real batch of consecutive position ids."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def trace_hf(config: Any, setup: Setup, *, fake: bool = True, device_type: str = "cuda",
             force_unpacked: bool = True, name: str | None = None, progress: Progress | None = None,
             timeout: float | None = None) -> Trace:
    """:func:`memlab.tracing.tracer.trace_step` of ``AutoModelForCausalLM.from_config(hf_config(config))`` under
    ``setup``.

    ``setup.attention``: ``eager`` is transformers' eager attention, the others its ``sdpa`` implementation pinned
    to that SDPA backend; ``recompute='full'`` is ``activation_checkpointing_enable`` (non-reentrant); ``selective``
    has no transformers equivalent; ``finetune='lora'`` wraps the model with peft
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
        raise SetupError("transformers has no selective (attention-core) recompute: use recompute='none' or 'full'")
    if setup.attention_mask == "padded":  # transformers reads the mask's values, which fake tensors lack
        raise SetupError("trace_hf traces the call without an attention mask or with an all-ones one, not a padded "
                         "batch (transformers reads the mask's values, which fake tensors lack): measure it for real "
                         "(memlab.run.hf.run_hf with attention_mask='padded') or set attention_mask='none' or 'ones'")
    impl, backend = _ATTENTION[setup.attention]
    parts = setup_parts(setup, device_type=device_type)
    notes = list(parts.pop("notes"))
    notes.append(f"transformers {tf.__version__}, {cfg.model_type}, attn_implementation={impl}"
                 + (f" (SDPA backend {backend})" if backend else ""))
    if force_unpacked:
        notes.append("unpadded, unpacked batch forced (no attention mask: SDPA is_causal, native GQA); valid only "
                     "for batches without padding or packed sequences")
    vocab = int(cfg.vocab_size)

    def model_fn() -> nn.Module:
        if progress is not None:
            progress(f"building {cfg.model_type} from its config (fake tensors)")
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=model_dtype(setup.policy))
        if setup.recompute == "full":
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        _check_positions(model, cfg, setup.seq)
        if progress is not None:
            progress.watch_blocks(model)
        if setup.finetune != "full":  # peft wraps the model and moves its adapters (memlab.model.hf.apply_finetune)
            model = apply_finetune(model, setup)
        model.train()
        return model

    if setup.attention_mask == "ones":
        notes.append("attention_mask='ones': traced as the call without a mask, which saves the same (transformers "
                     "builds no mask for SDPA and the same causal mask for eager; measured on every tiny HF config, "
                     "benchmarks/call_conventions.py), with the loop's all-ones int64 mask held beside the token ids")

    def batch_fn() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (setup.batch, setup.seq))
        batch = {"input_ids": ids, "labels": ids.clone()}
        if setup.attention_mask == "ones":  # held by the loop as a real call's mask is; not handed to the model
            batch["attention_mask"] = torch.ones_like(ids)
        return batch

    options = LossOptions.of(setup)

    def one_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v for k, v in batch.items() if k != "attention_mask"}
        if options == LossOptions():
            return default_loss(model, batch)
        return hf_causal_lm_loss(model, batch["input_ids"], batch["labels"], options)

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not backend:
            return one_loss(model, batch)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(sdpa_backend(backend)):  # inside the step's autocast, as the forward runs it
            return one_loss(model, batch)

    ctx = unpacked_batches() if force_unpacked else contextlib.nullcontext()
    where = (lambda: progress.last) if progress is not None else (lambda: "no progress reported")
    hint = (f"{cfg.model_type}'s modelling code may loop over the tokens in Python on CPU (Mamba's recurrent scan "
            "does, once per token per block): trace a shorter seq or fewer layers, or allow more time")
    try:
        with ctx, quiet_transformers(), _quiet_fake_tensor_log(), time_bound(timeout, where, hint):
            return trace_step(model_fn, batch_fn, parts["step_fn"], loss_fn=loss_fn, fake=fake,
                              name=name or f"hf:{cfg.model_type}", setup=setup.to_dict(), notes=tuple(notes))
    except RuntimeError as exc:
        if "Expected inputs of BF16 type" in str(exc):  # torch/_meta_registrations.py _meta_grouped_mm_common
            raise SetupError(f"{cfg.model_type}: its grouped_mm experts are fp32 here (an fp32 model, or under "
                             "autocast, where no autocast rule casts them), and torch's fake-tensor kernel for "
                             "grouped_mm takes bf16 inputs only (torch/_meta_registrations.py _meta_grouped_mm_common;"
                             " on CUDA grouped_mm itself does), so this step does not trace: trace a bf16 model "
                             "(precision 'bf16'), or measure it for real on a CPU (memlab measure --hf)") from None
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
