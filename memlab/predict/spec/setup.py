"""The experiment setup shared by the estimator and the runner.

One :class:`Setup` (batch, sequence, precision policy, optimizer, recompute, attention, sharding) drives both
``memlab.predict.estimate`` (the prediction) and ``memlab.run.runner`` (the measurement), so every predicted number
has a measured twin. Precision policies live in :mod:`memlab.predict.spec.precision`. This module imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, get_args

from memlab.errors import SetupError, unknown_name
from memlab.predict.spec.precision import PRECISION_POLICIES, PrecisionPolicy, fsdp_mixed_policy, precision_policy
from memlab.predict.spec.validate import LIMITS, StrictInit, check_fields

Mode = Literal["train", "inference"]
Recompute = Literal["none", "selective", "full", "op"]
Attention = Literal["eager", "math", "flash", "efficient", "cudnn", "auto"]
ZeroStage = Literal[0, 1, 2, 3]
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adam-8bit", "adafactor", "paged-adamw", "paged-adam-8bit"]
InferenceWeights = Literal["fp32", "fp16", "bf16", "int8", "int4"]
KvDtype = Literal["fp32", "fp16", "bf16", "fp8", "int8"]
OptimizerImpl = Literal["auto", "for-loop", "foreach", "fused"]
LossKind = Literal["plain", "chunked", "fused"]
FsdpUnits = Literal["blocks", "torchtitan"]
FsdpLoss = Literal["inside", "outside"]
FsdpParamDtype = Literal["none", "bf16", "fp16"]
FsdpReduceDtype = Literal["fp32", "bf16", "fp16"]
Finetune = Literal["full", "lora", "qlora", "frozen"]
FsdpOutputDtype = Literal["none", "fp32", "bf16", "fp16"]
PpSchedule = Literal["1f1b", "gpipe", "interleaved"]
EpRouting = Literal["balanced", "worst"]
AttentionMask = Literal["none", "ones", "padded"]
LossCall = Literal["labels", "manual"]
PadSide = Literal["right", "left"]
LoraDtype = Literal["fp32", "bf16"]
Task = Literal["auto", "causal-lm", "masked-lm", "sequence-classification", "token-classification",
               "question-answering"]
KvCacheKind = Literal["dynamic", "static"]

MODES: tuple[str, ...] = get_args(Mode)
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
CHECKPOINTED = ("full", "op")
"""Recompute policies that run every block (``full``: with ``recompute_every`` 1) under ``torch.utils.checkpoint``:
a block keeps its input (and, under ``op``, what its policy saves) and runs again in backward."""
ATTENTION: tuple[str, ...] = get_args(Attention)
KERNELS: tuple[str, ...] = tuple(a for a in ATTENTION if a != "auto")
"""The attention kernels a step runs (``auto`` resolves to one of them: memlab.predict.spec.kernels)."""
DEVICE_TYPES = ("cuda", "cpu")
"""The devices a step is predicted for (their widths differ: autocast's op lists, norm kernels, step counters)."""
DEFAULT_DEVICE_TYPE = "cuda"
"""The one default for the device a prediction or a trace is made for: every function of memlab with a
``device_type`` argument defaults to it (tests/test_device.py), but those that say where a run executes."""

OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
TRAINER_OPTIMIZERS = {"adamw_bnb_8bit": "adam-8bit", "adamw_8bit": "adam-8bit", "paged_adamw_32bit": "paged-adamw",
                      "paged_adamw_8bit": "paged-adam-8bit"}
"""transformers ``TrainingArguments.optim`` spellings (``OptimizerNames``, training_args.py l. 130-135 of 5.25.0) of
the bitsandbytes optimizers memlab names otherwise: ``trainer_optimizer._get_bitsandbytes_optimizer`` builds
``bnb.optim.AdamW(optim_bits=8 if "8bit" in name else 32, is_paged="paged" in name)`` for each (l. 246-291), the
state layouts of ``AdamW8bit``, ``PagedAdamW32bit`` and ``PagedAdamW8bit``. ``--optimizer`` takes them (as
``--lora-targets`` takes peft's names: the field's ``metadata["spellings"]``)."""
INFERENCE_WEIGHTS: tuple[str, ...] = get_args(InferenceWeights)
KV_DTYPES: tuple[str, ...] = get_args(KvDtype)
KV_CACHE_KINDS: tuple[str, ...] = get_args(KvCacheKind)
GENERATE_LOGITS_TO_KEEP = 1
"""The positions whose logits transformers' ``generate()`` computes in prefill: it passes ``logits_to_keep=1`` to a
model whose forward takes it [hf-transformers: generation/utils.py, ``generate``: "If the model supports
`logits_to_keep` in forward(), set it to 1 to avoid computing the whole logit matrix"] (line 2958 of transformers
5.25.0); a plain forward's default is 0, every position (e.g. ``LlamaForCausalLM.forward(logits_to_keep=0)``)."""
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
LOSS_KINDS: tuple[str, ...] = get_args(LossKind)
LORA_KINDS = ("q", "k", "v", "o", "gate", "up", "down")
"""Module kinds an adapter may target (a fused QKV projection is adapted when any of q, k, v is named)."""
LORA_DEFAULT_RANK = 8
"""peft ``LoraConfig.r`` default (peft/tuners/lora/config.py)."""
LORA_DEFAULT_TARGETS = ("q", "v")
"""peft's default targets for Llama, Mistral, Qwen2 (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``); for
GPT-2 its default ``c_attn`` is the fused QKV projection, which q or v names here."""


LORA_OUTER_KINDS = ("embed", "head")
"""Modules outside the blocks an adapter may target (peft's Embedding LoRA on the token embedding, a Linear LoRA on
the LM head): traced, not in the formula (memlab.predict.coverage)."""
PEFT_TARGET_NAMES = {**{f"{kind}_proj": kind for kind in LORA_KINDS}, "embed_tokens": "embed", "lm_head": "head"}
"""peft ``target_modules`` spellings of the kinds as Llama-style families name their Linears (Llama, Mistral, Qwen2/3,
Gemma, Phi-3 after its split, ...): ``q_proj`` ... ``down_proj``; ``all-linear`` (peft's
``INCLUDE_LINEAR_LAYERS_SHORTHAND``: every Linear of the blocks, not the output head) names every kind."""


TARGET_REGEX_CHARS = frozenset("\\.^$*+?{}[]|()")
"""Characters that make ``lora_targets`` a regular expression (:func:`is_target_regex`): Python's ``re``
metacharacters, which no module name, kind or ``all-linear`` contains."""


def is_target_regex(text: str) -> bool:
    """True when ``lora_targets`` is a regular expression in peft's sense, not a name list: it holds one of
    :data:`TARGET_REGEX_CHARS` (``.*\\.(q_proj|v_proj)``, ``model\\.layers\\.[0-3]\\..*_proj``). peft matches a *string*
    ``LoraConfig.target_modules`` with ``re.fullmatch(target_modules, key)`` against each module's full name
    (peft/utils/other.py ``match_target_against_key``, called by tuners_utils.py ``check_target_module_exists``,
    peft 0.21.2) and a *list* by name or ``.name`` suffix; memlab's comma lists (``q_proj,v_proj``, ``q,v``) are the
    list form."""
    return any(ch in TARGET_REGEX_CHARS for ch in text)


def check_target_regex(text: str) -> None:
    """A :class:`SetupError` line for a ``lora_targets`` regex Python's ``re`` cannot compile (peft would raise
    ``re.error`` at its first module)."""
    try:
        re.compile(text)
    except re.error as exc:
        chars = "".join(sorted(TARGET_REGEX_CHARS))
        raise SetupError(f"lora_targets {text!r} reads as a regex (it holds one of {chars}) but re cannot compile "
                         f"it: {exc}; fix the pattern, or give a comma list of names") from None


def parse_targets(text: str) -> tuple[str, ...]:
    """``"q,v"`` or peft's ``"q_proj,v_proj"`` -> ``("q", "v")``; ``"all-linear"`` -> every kind of
    :data:`LORA_KINDS`; ``embed``/``embed_tokens`` and ``head``/``lm_head`` (:data:`LORA_OUTER_KINDS`) too.
    Comma-separated, each once; anything else raises :class:`SetupError` in one line. A regex
    (:func:`is_target_regex`) names modules, not kinds: resolved against a model's module names
    (:func:`memlab.model.hf.read_lora_regex`), here a :class:`SetupError` saying so."""
    if is_target_regex(text):
        raise SetupError(f"lora_targets {text!r} is a regex (peft's re.fullmatch on each module's full name): the "
                         "kinds it selects depend on the model's module names: resolve it against the model "
                         "(memlab.model.hf.read_lora_regex; memlab estimate --hf does, and the trace passes it to "
                         "peft as is)")
    names = [k.strip().lower() for k in text.split(",") if k.strip()]
    if names == ["all-linear"]:
        return LORA_KINDS
    kinds = tuple(PEFT_TARGET_NAMES.get(k, k) for k in names)
    bad = [n for n, k in zip(names, kinds, strict=True) if k not in LORA_KINDS + LORA_OUTER_KINDS]
    if bad:
        raise SetupError(f"lora_targets: unknown module kind {bad[0]!r}: use a comma-separated list of "
                         f"{', '.join(LORA_KINDS + LORA_OUTER_KINDS)} or peft's q_proj ... down_proj, embed_tokens, "
                         "lm_head (e.g. 'q,v', 'q_proj,v_proj'), or all-linear")
    if len(set(kinds)) != len(kinds):
        raise SetupError(f"lora_targets names a module kind twice ({text!r}): name each once")
    return kinds


LORA_SAVE_KINDS = ("head", "embed")
"""Modules peft can train in full beside the adapters (``LoraConfig.modules_to_save``): the LM head, the token
embedding."""


def parse_modules_to_save(text: str) -> tuple[str, ...]:
    """``"head,embed"`` -> ``("head", "embed")``: comma-separated kinds from :data:`LORA_SAVE_KINDS`, each once."""
    kinds = tuple(k.strip().lower() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in LORA_SAVE_KINDS]
    if bad or len(set(kinds)) != len(kinds):
        raise SetupError(f"lora_modules_to_save: {bad[0]!r} is not a module kind" if bad else
                         f"lora_modules_to_save names a kind twice ({text!r})"
                         f": use a comma-separated list of {', '.join(LORA_SAVE_KINDS)}, each once")
    return kinds


def default_logits_to_keep(mode: str) -> int:
    """``Setup.logits_to_keep`` when unset: 1 in inference (:data:`GENERATE_LOGITS_TO_KEEP`), 0 (every position)
    in training."""
    return GENERATE_LOGITS_TO_KEEP if mode == "inference" else 0


FUSED_OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
"""Optimizers torch.optim implements fused (one kernel, no step-sized temporaries)."""
FOREACH_OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor")
"""Optimizers torch.optim implements with multi-tensor ``_foreach_*`` ops."""


def resolve_optimizer_impl(optimizer: str, impl: str, device_type: str = "cuda") -> str:
    """The implementation a run uses: ``auto`` is what torch.optim picks by itself.

    torch.optim defaults to ``foreach`` when every parameter is on a CUDA device and to the for-loop otherwise;
    it never picks ``fused`` by default (torch/optim/optimizer.py, ``_default_to_fused_or_foreach``). Optimizers
    without a foreach/fused version (memlab's 8-bit Adam) always run the for-loop.
    """
    if impl == "auto":
        impl = "foreach" if device_type == "cuda" else "for-loop"
    if impl == "foreach" and optimizer not in FOREACH_OPTIMIZERS:
        return "for-loop"
    if impl == "fused" and optimizer not in FUSED_OPTIMIZERS:
        raise SetupError(f"optimizer_impl='fused' exists for {', '.join(FUSED_OPTIMIZERS)}, not {optimizer!r}: "
                         "use for-loop or foreach")
    return impl


def checkpointed_blocks(n_layers: int, every: int = 1) -> tuple[int, ...]:
    """The blocks (from 0) a full recompute over every ``every``-th block checkpoints: those with ``(i + 1) % every
    == 0``, as torchtitan's layer policy counts them (a counter incremented before the test, so block ``every - 1`` is
    the first; pytorch/torchtitan@9a8cb98 torchtitan/models/llama3/infra/parallelize.py lines 320-326,
    ``ptd_checkpoint_wrapper._count % ac_freq == 0``). ``every=1`` is every block."""
    return tuple(i for i in range(n_layers) if (i + 1) % every == 0)


SETUP_GROUPS: dict[str, tuple[str, ...]] = {
    "shape": ("batch", "seq", "mode"),
    "precision": ("precision", "inference_weights", "kv_cache_dtype"),
    "optimizer": ("optimizer", "optimizer_impl", "grad_accum_steps", "zero_grad_to_none"),
    "memory levers": ("recompute", "recompute_every", "activation_memory_budget", "attention", "loss", "loss_chunk",
                      "logits_to_keep", "offload_activations", "kv_cache", "checkpoint_reentrant"),
    "parallelism": ("zero_stage", "world_size", "tp", "sp", "pp", "pp_schedule", "pp_chunks", "micro_batches", "cp",
                    "ep", "ep_routing"),
    "fsdp2": ("fsdp_units", "fsdp_loss", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_output_dtype", "fsdp_offload",
              "fsdp_reshard_root"),
    "fine-tuning": ("finetune", "lora_rank", "lora_dropout", "lora_targets", "lora_modules_to_save", "frozen_layers",
                    "kbit_prepare", "lora_dtype"),
    "call": ("attention_mask", "pad_fraction", "padding_side", "loss_call", "task"),
}
"""Setup's fields by concern, each field in one group: :meth:`Setup.group` reads one, ``memlab estimate --help``
lists the options under them. A Setup is built from its fields by keyword (``Setup(batch=8, zero_stage=3)``)."""


@dataclass(frozen=True, kw_only=True)
class Setup(StrictInit):
    """Everything about a run that is not the model: shapes, precision, optimizer, memory policies, sharding.

    ``batch`` is the micro-batch per data-parallel rank; ``seq`` the sequence length in tokens. ``attention``
    names the kernel: ``eager`` materialises softmax(QK^T) (O(s^2) memory), ``math`` is PyTorch SDPA's math
    backend (also O(s^2)), ``flash``/``efficient``/``cudnn`` are fused SDPA kernels that keep no s x s matrix.
    ``zero_stage`` 0-3 shards optimizer states (1), gradients (2) and parameters (3) over ``world_size``
    data-parallel ranks; FSDP FULL_SHARD is stage 3 and SHARD_GRAD_OP stage 2. ``tp`` is the tensor-parallel
    degree and ``sp`` turns on sequence parallelism (Korthikanti et al. 2022). ``ep`` splits a mixture of experts'
    experts over that many of the ``world_size`` data-parallel ranks (:mod:`memlab.predict.parallel.experts`).

    Each field's docstring is its help text in the ``memlab`` command, which generates its options from these
    fields (``metadata`` may name ``choices``, a shorter ``flag``, ``max`` with its reason ``why``, and the
    ``mode`` a field applies to), so the CLI and the API share one set of defaults and limits: the ones written
    here. An unknown field name is a SetupError naming the closest one. ``__post_init__`` checks every field by
    its annotation (:mod:`memlab.predict.spec.validate`), so a new field is validated by its type without new code.
    """

    _error = SetupError  # what StrictInit raises for an unknown or missing field (a class attribute, not a field)

    batch: int = field(default=1, metadata=LIMITS["batch"].meta())
    """Micro-batch per data-parallel rank, in sequences."""
    seq: int = field(default=1024, metadata=LIMITS["seq"].meta())
    """Sequence length in tokens (the CLI lowers it to the model's max_seq when that is shorter)."""
    mode: Mode = "train"
    """``train`` (forward, backward, optimizer step) or ``inference`` (weights and KV cache, prefill and decode)."""
    precision: str = field(default="fp32", metadata={"choices": tuple(PRECISION_POLICIES), "mode": "train"})
    """Training precision policy (memlab.predict.spec.precision): how weights, gradients and master copies are
    stored."""
    optimizer: Optimizer = field(default="adamw", metadata={"mode": "train", "spellings": TRAINER_OPTIMIZERS})
    """Optimizer whose state is counted (and run). paged-adamw and paged-adam-8bit are bitsandbytes' paged optimizers
    (transformers' paged_adamw_32bit and paged_adamw_8bit, also accepted): the states of tensors of at least 1e5
    elements live in CUDA managed memory, outside torch's allocator, reported apart (paged_bytes)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (the attention core, Korthikanti et al.), full (every block;
    with recompute_every k, every k-th block) or op (torchtitan's per-op policy: every block checkpointed, the
    outputs of its 1st, 3rd, ... aten.mm and of CUDA's fused attention kept, the rest recomputed)."""
    recompute_every: int = field(default=1, metadata=LIMITS["layers"].meta(mode="train"))
    """With recompute='full': checkpoint every k-th block only (blocks k-1, 2k-1, ... from 0; the others keep what
    they keep without recompute): torchtitan's layer policy, selective_ac_option='k'. 1: every block (transformers'
    gradient checkpointing, Megatron's full)."""
    activation_memory_budget: float = field(default=1.0, metadata={"max": 1.0, "why": "a fraction of the activations "
                                                                   "saved without recompute", "mode": "train"})
    """torch.compile's activation memory budget (torch._functorch.config.activation_memory_budget; torchtitan's
    memory_budget mode): 1 is torch's default; below 1 the compiled graph's partitioner picks what to recompute, which
    memlab cannot trace (refused: use recompute op, full or recompute_every instead)."""
    checkpoint_reentrant: bool = field(default=False, metadata={"mode": "train", "flag": "--reentrant"})
    """With recompute='full' on a Hugging Face model: torch's reentrant checkpoint (CheckpointFunction: each block
    runs under no_grad, keeps its positional inputs, and in backward runs again and backpropagates inside) instead of
    the non-reentrant one. False is transformers' default (transformers 5.25 modeling_utils.py l. 3159-3160:
    use_reentrant=False when no kwargs are given, as Trainer(gradient_checkpointing=True) calls it); True is what
    peft's prepare_model_for_kbit_training(model) alone leaves: its gradient_checkpointing_kwargs=None becomes {}
    (peft 0.21 utils/other.py l. 190-191, 253-258), so transformers passes no use_reentrant and torch 2.13's
    checkpoint warns and takes use_reentrant=True (torch/utils/checkpoint.py l. 486-496)."""
    attention: Attention = field(default="eager", metadata={"cli_default": "auto"})
    """Attention kernel: eager/math keep the s x s scores; flash/efficient/cudnn are fused and keep none; auto is
    what the libraries run (transformers' default implementation, then the kernel torch dispatches on the device:
    memlab.predict.spec.kernels), the command line's default."""
    zero_stage: ZeroStage = field(default=0, metadata={"flag": "--zero"})
    """ZeRO stage over the data-parallel ranks: 1 shards optimizer states, 2 also gradients, 3 also parameters."""
    world_size: int = field(default=1, metadata=LIMITS["ranks"].meta())
    """Data-parallel ranks."""
    tp: int = field(default=1, metadata=LIMITS["tp"].meta())
    """Tensor-parallel degree."""
    sp: bool = False
    """Sequence parallelism (needs tp > 1)."""
    # -- pipeline and context parallelism (memlab.predict.parallel.pipeline; issue 19)
    # -----------------------------------
    pp: int = field(default=1, metadata={**LIMITS["pp"].meta(mode="train")})
    """Pipeline-parallel stages (ranks); ``batch`` is then the micro-batch (memlab.predict.parallel.pipeline)."""
    pp_schedule: PpSchedule = field(default="1f1b", metadata={"mode": "train", "aliases": ("--schedule",)})
    """Pipeline schedule: 1f1b (min(p - rank, m) micro-batches in flight), gpipe (all m) or interleaved 1F1B."""
    pp_chunks: int = field(default=1, metadata={**LIMITS["pp"].meta(mode="train")})
    """Model chunks (virtual stages) per pipeline rank: > 1 only with the interleaved schedule."""
    micro_batches: int = field(default=1, metadata={**LIMITS["grad_accum"].meta(mode="train")})
    """Micro-batches per step through the pipeline (m)."""
    cp: int = field(default=1, metadata={**LIMITS["cp"].meta(mode="train")})
    """Context-parallel ranks: each holds seq / cp tokens of every sequence (ring attention; a fused kernel)."""
    # -- expert parallelism (memlab.predict.parallel.experts; issue 19)
    # ---------------------------------------------------
    ep: int = field(default=1, metadata={**LIMITS["ranks"].meta(mode="train")})
    """Expert-parallel ranks: each holds n_experts / ep of every MoE layer's experts, drawn from the world_size
    data-parallel ranks (Megatron-Core, DeepSpeed-MoE); tokens reach their experts by all-to-all."""
    ep_routing: EpRouting = field(default="balanced", metadata={"mode": "train"})
    """Tokens an expert-parallel rank receives (the router is dropless): balanced (t x top_k) or worst (all its
    ep peers' tokens choose its experts)."""
    inference_weights: InferenceWeights = field(default="bf16", metadata={"flag": "--weights", "mode": "inference"})
    """Weight dtype when mode is inference."""
    kv_cache_dtype: KvDtype = field(default="bf16", metadata={"flag": "--kv-dtype", "mode": "inference"})
    """KV-cache element type when mode is inference."""
    optimizer_impl: OptimizerImpl = field(default="auto", metadata={"mode": "train"})
    """Optimizer implementation: for-loop (one tensor at a time), foreach (multi-tensor: a step-sized temporary),
    fused (one kernel, no temporary) or auto (what torch picks: foreach on CUDA, for-loop on CPU)."""
    grad_accum_steps: int = field(default=1, metadata=LIMITS["grad_accum"].meta(mode="train"))
    """Micro-batches per optimizer step; gradients persist (and accumulate) across the micro-steps."""
    zero_grad_to_none: bool = field(default=True, metadata={"mode": "train"})
    """zero_grad(set_to_none=True), torch's default, frees gradients; False keeps them, zero-filled, between steps."""
    # -- the loss at large vocabularies and activation offload (memlab.model.loss; issue 18) --------------------
    loss: LossKind = field(default="plain", metadata={"mode": "train"})
    """LM head + cross-entropy: plain (full logits, upcast to fp32, as HF's ForCausalLMLoss), chunked (head and
    loss per chunk of tokens, recomputed in backward: no t x V tensor kept) or fused (Liger-style fused linear +
    cross-entropy: gradients computed chunk by chunk in forward, logits never held in full)."""
    loss_chunk: int = field(default=0, metadata={**LIMITS["seq"].meta(mode="train"), "min": 0})
    """Tokens per loss chunk for chunked/fused (0: Liger's rule, next_pow2(ceil(t / ceil(V / h))) tokens)."""
    logits_to_keep: int | None = field(default=None, metadata={**LIMITS["seq"].meta(), "min": 0})
    """Compute logits (and the loss) for the last N positions of each sequence only (HF logits_to_keep; 0: all).
    Unset: the library's default, 0 in training (a forward's) and 1 in inference (generate()'s prefill)."""
    offload_activations: bool = field(default=False, metadata={"mode": "train", "flag": "--offload"})
    """torch.autograd.graph.save_on_cpu(pin_memory=True): saved activations live in pinned host memory."""
    # -- FSDP2 (ZeRO stage 2/3 over world_size > 1; memlab.predict.memory.fsdp, memlab.model.fsdp) ---------------------
    fsdp_units: FsdpUnits = field(default="blocks", metadata={"mode": "train"})
    """FSDP2 wrapping plan: blocks (each block a unit; embedding, final norm and head in the root) or torchtitan
    (embedding, each block, final norm + head as their own units)."""
    fsdp_loss: FsdpLoss = field(default="inside", metadata={"mode": "train"})
    """Where the loss is computed under FSDP2: inside the root module's forward, or outside it (torchtitan)."""
    fsdp_param_dtype: FsdpParamDtype = field(default="none", metadata={"mode": "train"})
    """FSDP2 MixedPrecisionPolicy.param_dtype: gather and compute in bf16/fp16 over fp32 shards, no autocast (needs
    precision fp32 and FSDP2); none: no MixedPrecisionPolicy."""
    fsdp_reduce_dtype: FsdpReduceDtype = field(default="fp32", metadata={"mode": "train"})
    """FSDP2 MixedPrecisionPolicy.reduce_dtype: the dtype gradients are reduce-scattered in (with fsdp_param_dtype)."""
    fsdp_output_dtype: FsdpOutputDtype = field(default="none", metadata={"mode": "train"})
    """FSDP2 MixedPrecisionPolicy.output_dtype: only none (no cast of the units' outputs) is modelled; the rest
    are refused."""
    fsdp_offload: bool = field(default=False, metadata={"mode": "train"})
    """FSDP2 CPUOffloadPolicy (pinned): sharded parameters, gradients and optimizer states live on the host (the
    optimizer steps there); the device holds the gathered units, their buffers and unsharded gradients."""
    fsdp_reshard_root: bool = field(default=False, metadata={"mode": "train"})
    """FSDP2 reshard_after_forward of the root unit: False (FSDP2's default: the root stays gathered into backward)
    or True (freed after forward, gathered again at the start of backward). The blocks' (and the torchtitan
    embedding's) choice is the ZeRO stage: 3 reshards them, 2 does not; torchtitan's head unit never reshards."""
    # -- parameter-efficient fine-tuning (memlab.predict.memory.finetune) --------------------------------------------
    finetune: Finetune = field(default="full", metadata={"mode": "train"})
    """full (every parameter trains), lora (rank-r adapters on a frozen base, peft), qlora (adapters on a 4-bit
    NF4 base with double quantisation, bitsandbytes; precision bf16, or amp-fp16 on cards without bf16 such as the
    T4: fp16 compute under autocast and a GradScaler) or frozen (the embeddings and the bottom
    frozen_layers blocks frozen, the rest trained in full)."""
    lora_rank: int = field(default=0, metadata={"max": 65536, "why": "a rank above the widest published model's "
                                                "width adapts nothing low-rank", "mode": "train"})
    """LoRA rank r (0: peft's default 8 when finetune is lora or qlora)."""
    lora_dropout: float = field(default=0.0, metadata={"max": 1.0, "max_open": True, "why": "a drop probability, "
                                                       "below 1", "mode": "train"})
    """Dropout on each adapter's input (peft lora_dropout): keeps a noise tensor and the dropped input per module."""
    lora_targets: str = field(default="", metadata={"mode": "train"})
    """Adapted module kinds, comma-separated, from q,k,v,o,gate,up,down, or as peft's LoraConfig names them
    (q_proj ... down_proj, all-linear) ('': peft's default q,v); or a regex (any of \\.^$*+?{}[]|()), passed to peft
    as a string target_modules: re.fullmatch on each module's full name, e.g. '.*\\.(q_proj|v_proj)'."""
    lora_modules_to_save: str = field(default="", metadata={"mode": "train"})
    """Modules trained in full beside the adapters (peft modules_to_save), comma-separated: head, embed."""
    frozen_layers: int = field(default=0, metadata={"max": LIMITS["layers"].max, "why": "at most the model's blocks",
                                                    "mode": "train"})
    """With finetune='frozen': the bottom blocks frozen with the embeddings (requires_grad False)."""
    kbit_prepare: bool = field(default=False, metadata={"mode": "train"})
    """With finetune lora or qlora: peft's ``prepare_model_for_kbit_training`` applied to the base before its adapters
    (peft/utils/other.py: every fp16/bf16 parameter that is not a Params4bit, the embeddings, norms and LM head,
    cast to fp32), as QLoRA scripts and TRL's SFTTrainer before huggingface/trl 2af35fb0d (Dec 2025) do for a 4-bit
    model. Off by default, as SFTTrainer now runs (the base as loaded, peft's get_peft_model alone), which the
    formula models; on, the trace answers. The checkpointing it enables by default is torch's reentrant one:
    recompute='full' with checkpoint_reentrant."""
    lora_dtype: LoraDtype = field(default="fp32", metadata={"mode": "train"})
    """With finetune lora or qlora: the adapters' dtype. fp32 is peft's default (LoraConfig
    autocast_adapter_dtype=True casts 16-bit adapters to fp32), which the formula models; bf16 is what TRL's
    SFTTrainer does to a k-bit model's adapters (it casts every trainable parameter to bf16), the trace answers it."""
    # -- calling conventions (issue 17 point 2; memlab.run.hf.call_inputs) ---------------------------------------
    attention_mask: AttentionMask = field(default="none", metadata={"mode": "train"})
    """How the model is called: none (model(input_ids, labels=...) with no attention mask, memlab's runs), ones
    (an all-ones (batch, seq) mask passed) or padded (a right-padded batch: mask 0 and labels -100 on the padding)."""
    pad_fraction: float = field(default=0.0, metadata={"max": 1.0, "max_open": True, "why": "a share of the "
                                                       "tokens, below 1", "mode": "train"})
    """With attention_mask='padded': the share of the batch's tokens that are padding (0 <= f < 1)."""
    padding_side: PadSide = field(default="right", metadata={"mode": "train"})
    """With attention_mask='padded': where each row's padding sits, right (the end, training collators) or left
    (the start, generation-style batches; a transformers tokenizer's padding_side)."""
    kv_cache: KvCacheKind = field(default="dynamic", metadata={"mode": "inference"})
    """The KV cache of generation: dynamic (transformers' DynamicCache, generate()'s default: each layer's keys and
    values grow by torch.cat every step) or static (StaticCache: preallocated to seq tokens, written in place)."""
    loss_call: LossCall = field(default="labels", metadata={"mode": "train"})
    """How the loss is called: labels (model(input_ids, labels=...): transformers' loss upcasts the logits to fp32
    and shifts the labels) or manual (logits = model(input_ids).logits, then F.cross_entropy(logits.view(-1, V),
    targets.view(-1)) on the user's next-token targets: the log-softmax in the logits' dtype; training only)."""
    task: Task = field(default="auto", metadata={"mode": "train"})
    """The head a Hugging Face config is built with (memlab.model.tasks): auto (the head the config's
    architectures names, else the causal LM), causal-lm, masked-lm, sequence-classification, token-classification or
    question-answering; the formula models the causal LM, the trace every head."""

    def __post_init__(self) -> None:
        # Types, ranges and Literal choices of every field from its annotation and metadata
        # (memlab.predict.spec.validate): a bool is no count, a float no ZeRO stage, 'training' no mode. precision and
        # optimizer are names with a closest-match message (UnknownNameError), checked after.
        check_fields(self, SetupError, skip=("precision", "optimizer"))
        if self.logits_to_keep is None:  # the library's default for the (canonical) mode; frozen: __post_init__ only
            object.__setattr__(self, "logits_to_keep", default_logits_to_keep(self.mode))
        for name in ("precision", "optimizer"):
            if not isinstance(getattr(self, name), str):
                raise SetupError(f"Setup.{name} must be a string, got {getattr(self, name)!r}: pass e.g. "
                                 f"{type(self).__dataclass_fields__[name].default!r}")
        precision_policy(self.precision)
        if self.optimizer not in OPTIMIZERS:
            raise unknown_name("optimizer", self.optimizer, list(OPTIMIZERS))
        if self.sp and self.tp == 1:
            raise SetupError("sequence parallelism (sp) needs tensor parallelism: set tp > 1 or drop sp")
        resolve_optimizer_impl(self.optimizer, self.optimizer_impl)
        self._check_parallel()
        if self.loss == "plain" and self.loss_chunk:
            raise SetupError(f"loss_chunk={self.loss_chunk} applies to loss='chunked' or 'fused', not 'plain': set "
                             "loss='chunked' (or drop loss_chunk)")
        if self.logits_to_keep > self.seq:
            raise SetupError(f"logits_to_keep={self.logits_to_keep} exceeds seq={self.seq}: keep at most seq positions "
                             "(0 keeps all)")
        if self.mode == "inference" and (self.loss != "plain" or self.offload_activations):
            raise SetupError("loss and offload_activations describe a training step: drop them with mode='inference'")
        if self.fsdp_param_dtype != "none" and self.mode == "train" and not (self.zero_stage >= 2
                                                                            and self.world_size > 1):
            raise SetupError("fsdp_param_dtype is FSDP2's MixedPrecisionPolicy: set zero_stage=2 or 3 and "
                             "world_size > 1 (or use precision amp-bf16 / mixed-bf16 on one rank)")
        sharded = self.mode == "train" and self.zero_stage >= 2 and self.world_size > 1
        if self.fsdp_offload and self.mode == "train" and not (sharded and self.tp == 1):
            raise SetupError("fsdp_offload is FSDP2's CPUOffloadPolicy: set zero_stage=2 or 3, world_size > 1 and "
                             "tp=1 (or drop fsdp_offload)")
        self._check_finetune()
        self._check_call()
        if self.checkpoint_reentrant and (self.recompute != "full" or self.mode != "train"):
            raise SetupError(f"checkpoint_reentrant chooses torch's reentrant checkpoint for recompute='full' in "
                             f"training, not recompute={self.recompute!r} in mode={self.mode!r}: set recompute='full' "
                             "(or drop checkpoint_reentrant)")
        if self.recompute_every > 1 and self.recompute != "full":
            raise SetupError(f"recompute_every={self.recompute_every} checkpoints every k-th block: it goes with "
                             f"recompute='full', not {self.recompute!r} (set recompute='full', or drop "
                             "recompute_every)")

    def _check_call(self) -> None:
        """One SetupError line for a calling convention (``attention_mask``, ``padding_side``, ``loss_call``) whose
        fields contradict each other (what memlab has measured is :mod:`memlab.predict.coverage`'s)."""
        if self.pad_fraction and self.attention_mask != "padded":
            raise SetupError(f"pad_fraction={self.pad_fraction} goes with attention_mask='padded', not "
                             f"{self.attention_mask!r}: set attention_mask='padded' (or drop pad_fraction)")
        if self.padding_side != "right" and self.attention_mask != "padded":
            raise SetupError(f"padding_side={self.padding_side!r} goes with attention_mask='padded', not "
                             f"{self.attention_mask!r}: set attention_mask='padded' (or drop padding_side)")
        if self.loss_call == "manual" and (self.loss != "plain" or self.logits_to_keep or self.mode != "train"):
            raise SetupError("loss_call='manual' is the plain cross-entropy on every position's logits: use "
                             "loss='plain' without logits_to_keep in mode='train' (or loss_call='labels')")

    def _check_parallel(self) -> None:
        """One SetupError line for pipeline fields that contradict each other (what memlab models of a layout is
        :mod:`memlab.predict.coverage`'s)."""
        if self.ep > 1:
            self._check_ep()
        if self.pp_chunks > 1 and self.pp_schedule != "interleaved":
            raise SetupError(f"pp_chunks={self.pp_chunks} are the interleaved schedule's model chunks: set "
                             "pp_schedule='interleaved' (or pp_chunks=1)")
        if self.pp_schedule == "interleaved" and (self.pp == 1 or self.pp_chunks == 1):
            raise SetupError("the interleaved schedule needs pp > 1 and pp_chunks > 1 (with one chunk it is 1F1B)")
        if self.micro_batches > 1 and self.pp == 1:
            raise SetupError("micro_batches are a pipeline's (pp > 1): without a pipeline use grad_accum_steps")

    def _check_ep(self) -> None:
        """One SetupError line for an expert-parallel layout that cannot exist: ep must divide world_size."""
        if self.world_size % self.ep:
            raise SetupError(f"ep={self.ep} must divide world_size={self.world_size}: the expert-parallel ranks are "
                             "drawn from the data-parallel ranks (set world_size to a multiple of ep)")

    def _check_finetune(self) -> None:
        """One SetupError line for fine-tuning fields that contradict each other (what memlab models of them is
        :mod:`memlab.predict.coverage`'s)."""
        lora_fields = [n for n in ("lora_rank", "lora_dropout", "lora_targets", "lora_modules_to_save",
                                   "kbit_prepare") if getattr(self, n)] + (["lora_dtype"] if self.lora_dtype != "fp32"
                                                                            else [])
        if self.finetune in ("full", "frozen"):
            if lora_fields:
                raise SetupError(f"{', '.join(lora_fields)} set with finetune={self.finetune!r}: set finetune='lora' "
                                 "or 'qlora', or drop them")
            if (self.finetune == "frozen") != (self.frozen_layers > 0):
                raise SetupError("frozen_layers goes with finetune='frozen' (and needs at least 1 block): set both "
                                 "or neither")
            if self.finetune == "full":
                return
        elif self.frozen_layers:
            raise SetupError(f"frozen_layers set with finetune={self.finetune!r}: it goes with finetune='frozen'")
        if is_target_regex(self.lora_targets):
            check_target_regex(self.lora_targets)
        else:
            parse_targets(self.lora_targets)
        parse_modules_to_save(self.lora_modules_to_save)
        if self.mode != "train":
            raise SetupError(f"finetune={self.finetune!r} is a training setup: set mode='train' (inference of a "
                             "merged adapter is the base model's)")

    @property
    def lora_r(self) -> int:
        """The LoRA rank in force: ``lora_rank``, or peft's default 8 (0 under full fine-tuning)."""
        if self.finetune in ("full", "frozen"):
            return 0
        return self.lora_rank or LORA_DEFAULT_RANK

    @property
    def lora_save_kinds(self) -> tuple[str, ...]:
        """The modules trained in full beside the adapters: ``lora_modules_to_save`` parsed."""
        return parse_modules_to_save(self.lora_modules_to_save)

    @property
    def lora_target_kinds(self) -> tuple[str, ...]:
        """The adapted module kinds: ``lora_targets`` parsed, or peft's default ``("q", "v")``."""
        return parse_targets(self.lora_targets) or LORA_DEFAULT_TARGETS

    @property
    def policy(self) -> PrecisionPolicy:
        """The :class:`PrecisionPolicy` named by ``precision``; with ``fsdp_param_dtype`` in training, FSDP2's
        :func:`~memlab.predict.spec.precision.fsdp_mixed_policy` over it."""
        if self.fsdp_param_dtype != "none" and self.mode == "train":
            return fsdp_mixed_policy(self.fsdp_param_dtype, self.fsdp_reduce_dtype)
        return precision_policy(self.precision)

    @property
    def fused_attention(self) -> bool:
        """True for kernels that never materialise the s x s score matrix."""
        return self.attention in ("flash", "efficient", "cudnn")

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch on one rank: batch * seq."""
        return self.batch * self.seq

    def to_dict(self) -> dict[str, object]:
        """Plain dict of the fields (for JSON lines and DataFrames)."""
        return asdict(self)

    def group(self, name: str) -> dict[str, object]:
        """The fields of one :data:`SETUP_GROUPS` group and their values (``setup.group("parallelism")``)."""
        if name not in SETUP_GROUPS:
            raise SetupError(f"no Setup group {name!r}: the groups are {', '.join(SETUP_GROUPS)}")
        return {field: getattr(self, field) for field in SETUP_GROUPS[name]}

    def with_(self, **changes: object) -> Setup:
        """A copy with some fields changed (validated again). A new ``mode`` takes that mode's default
        ``logits_to_keep`` unless this setup's was set to another value or ``changes`` names it."""
        mode = changes.get("mode", self.mode)
        if (mode != self.mode and "logits_to_keep" not in changes
                and self.logits_to_keep == default_logits_to_keep(self.mode)):
            changes = {**changes, "logits_to_keep": None}
        return replace(self, **changes)



class SetupView:
    """A read-only :class:`Setup` with some fields replaced, unvalidated: the estimator's vectorised sweeps give it
    numpy arrays for ``batch`` and ``seq`` (:func:`memlab.predict.estimate.sweep_totals`).

    A field reads from ``overrides`` first, then from ``base``; the derived properties (``policy``,
    ``fused_attention``, ``tokens``) are :class:`Setup`'s own, computed on the view, so ``tokens`` is
    ``batch * seq`` of the overridden arrays. A view of a view merges the overrides onto the first base.
    Only field names are accepted: an unknown one is a :class:`~memlab.errors.SetupError`.
    """

    __slots__ = ("_base", "_over")

    def __init__(self, base: Setup | SetupView, **overrides: Any) -> None:
        unknown = sorted(set(overrides) - set(Setup.__dataclass_fields__))
        if unknown:
            raise SetupError(f"SetupView overrides Setup fields only, not {', '.join(unknown)}")
        if isinstance(base, SetupView):
            base, overrides = base._base, {**base._over, **overrides}
        if not isinstance(base, Setup):
            raise SetupError(f"SetupView needs a memlab.predict.spec.setup.Setup, got {type(base).__name__}")
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_over", overrides)

    def __getattr__(self, name: str) -> Any:
        over = object.__getattribute__(self, "_over")
        return over[name] if name in over else getattr(object.__getattribute__(self, "_base"), name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SetupView is read-only (cannot set {name})")

    policy = property(Setup.policy.fget, doc="The :class:`PrecisionPolicy` named by ``precision``.")
    fused_attention = property(Setup.fused_attention.fget, doc="True for kernels that keep no s x s score matrix.")
    tokens = property(Setup.tokens.fget, doc="Tokens per micro-batch on one rank: batch * seq (arrays in a sweep).")
    lora_r = property(Setup.lora_r.fget, doc="The LoRA rank in force (peft's default 8 when unset).")
    lora_target_kinds = property(Setup.lora_target_kinds.fget, doc="The adapted module kinds (default q, v).")
    lora_save_kinds = property(Setup.lora_save_kinds.fget, doc="The modules trained in full beside the adapters.")
