"""What memlab models, in one table: :data:`TABLE`.

Each :class:`Entry` is a predicate over one :class:`Case` (the model, the setup, the device the step runs on)
and what follows when it holds, one of three kinds:

- a **refusal** (``refuse``): memlab does not model the case; the message says why and the way out. A
  :class:`~memlab.predict.spec.setup.Setup` only has to be *valid* (its own ``__post_init__``); whether memlab
  models it is asked here, when :func:`memlab.predict.estimate.estimate` runs, so a trace or a real run can still
  take a valid setup the formula refuses.
- an **assumption** (``says``): a sentence every estimate of the case prints, first.
- **named terms** (``terms``): what the estimate leaves out, each with its size, the phases it can change and its
  sign (:class:`NamedTerm`), next to the assumption that names them; the real peak's range follows from them
  (:class:`PeakRange`).

The estimate's refusals (:func:`refusal`), its assumptions (:func:`assumptions`) and its named terms
(:func:`named_terms`) are views of this one table, read in its order. Sizes are bytes on one rank. No torch.

How to add a case: one :class:`Entry` in :data:`TABLE`, at the place its sentence should print; a predicate used
by several entries becomes a :class:`Case` property (``loss_options`` is "a chunked or fused loss or kept
positions", once).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memlab.errors import SetupError
from memlab.predict.memory.breakdown import MemoryBreakdown, NamedTerm, PeakRange, rank_breakdown
from memlab.predict.memory.family_terms import (
    check_family_setup,
    cuda_autocast_gelu_note,
    manual_loss,
    padding_present,
)
from memlab.predict.memory.finetune import lora_layer_elements
from memlab.predict.memory.fsdp import FsdpPlan, plan_of
from memlab.predict.memory.fsdp import unmodelled as fsdp_unmodelled
from memlab.predict.memory.phases import layer_terms
from memlab.predict.memory.plan import REST_FIELDS
from memlab.predict.memory.states import PAGED_OPTIMIZERS
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import (
    CHECKPOINTED,
    Setup,
    SetupView,
    checkpointed_blocks,
    is_target_regex,
    resolve_optimizer_impl,
)


# -- the records --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """What an entry's predicate sees: the model (a config or a bare parameter count), the setup (its batch and
    seq may be numpy arrays in a sweep, or None where only the rest is read), the device the step runs on, and
    for named terms the estimate's breakdown."""

    config: TransformerConfig | int
    setup: Any
    device_type: str = "cuda"
    overheads: Any = None
    bd: MemoryBreakdown | None = None

    @property
    def is_config(self) -> bool:
        """A model config, not a bare parameter count."""
        return isinstance(self.config, TransformerConfig)

    @property
    def train(self) -> bool:
        """A training step."""
        return self.setup.mode == "train"

    @property
    def hf(self) -> bool:
        """A Hugging Face family's config (not memlab's own GPT, not a bare count)."""
        return self.is_config and self.config.impl.family != "reference"  # type: ignore[union-attr]

    @property
    def loss_options(self) -> bool:
        """A chunked or fused loss, or kept positions (``logits_to_keep``)."""
        return self.setup.loss != "plain" or bool(self.setup.logits_to_keep)

    @property
    def reshaped_end(self) -> bool:
        """No t x V logits at the end of forward: :attr:`loss_options` or activation offload."""
        return self.loss_options or self.setup.offload_activations

    @property
    def sharded(self) -> bool:
        """Training under FSDP2: ZeRO-2/3 over more than one rank."""
        return self.train and self.setup.zero_stage >= 2 and self.setup.world_size > 1

    @functools.cached_property
    def fsdp(self) -> FsdpPlan | None:
        """The FSDP2 plan where FSDP2 applies (:func:`memlab.predict.memory.fsdp.plan_of`), else None."""
        return plan_of(self.config, self.setup) if self.is_config else None  # type: ignore[arg-type]

    @functools.cached_property
    def _layer_terms(self) -> dict[str, float]:
        return layer_terms(self.config, self.setup, self.device_type)  # type: ignore[arg-type]

    def layer(self, key: str) -> float:
        """``layer_terms(...)[key]`` of the case (:func:`memlab.predict.memory.phases.layer_terms`), listed once."""
        return self._layer_terms[key]

    def top_block(self) -> float:
        """:func:`top_block_bound_bytes` of the case, from its :meth:`layer` terms."""
        return self.layer("temp") + _blocks0(self.config) * self.setup.policy.grad_bytes / self.setup.tp  # type: ignore[arg-type]


Text = str | Callable[[Case], "str | None"]


@dataclass(frozen=True)
class Entry:
    """One row of :data:`TABLE`: when ``when`` holds, memlab refuses (``refuse``: the message, with the way out),
    says an assumption (``says``, printed before the seq-dependent note, or after it with ``tail``), or names
    terms the estimate leaves out (``terms``, each a :class:`NamedTerm`; ``says`` is then the sentence that names
    them, where one is printed)."""

    key: str
    when: Callable[[Case], bool]
    refuse: Text | None = None
    says: Text | None = None
    terms: Callable[[Case], list[NamedTerm]] | None = None
    tail: bool = False

    def text(self, field: Text | None, case: Case) -> str | None:
        """The entry's ``refuse`` or ``says`` text for ``case`` (a callable is called)."""
        return field(case) if callable(field) else field


def _listed(pairs: tuple[tuple[str, Any], ...]) -> list[str]:
    return [name for name, on in pairs if on]


# -- refusals: what memlab does not model, with the way out -------------------------------------------------------
def _ep_unmodelled(c: Case) -> list[str]:
    s = c.setup
    return _listed((
        ("mode='inference'", s.mode != "train"), ("pp > 1", s.pp > 1), ("cp > 1", s.cp > 1),
        ("grad_accum_steps > 1", s.grad_accum_steps > 1), ("a chunked or fused loss", s.loss != "plain"),
        ("logits_to_keep", s.logits_to_keep), ("offload_activations", s.offload_activations),
        ("fsdp_offload", s.fsdp_offload), ("fsdp_param_dtype", s.fsdp_param_dtype != "none"),
        (f"finetune={s.finetune!r}", s.finetune != "full"),
        (f"optimizer={s.optimizer!r}", s.optimizer in ("adam-8bit", "adafactor"))))


def _pp_unmodelled(c: Case) -> list[str]:
    s = c.setup
    return _listed((
        ("grad_accum_steps > 1", s.grad_accum_steps > 1), ("a chunked or fused loss", s.loss != "plain"),
        ("logits_to_keep", s.logits_to_keep), ("offload_activations", s.offload_activations),
        ("fsdp_offload", s.fsdp_offload), ("fsdp_param_dtype", s.fsdp_param_dtype != "none"),
        (f"finetune={s.finetune!r}", s.finetune != "full"),
        (f"optimizer={s.optimizer!r}", s.optimizer in ("adam-8bit", "adafactor"))))


def _mask_unmodelled(c: Case) -> list[str]:
    s = c.setup
    return _listed((
        ("mode='inference'", s.mode != "train"),
        (f"precision={s.precision!r}", s.precision not in ("fp32", "bf16", "amp-bf16")),
        (f"recompute={s.recompute!r}", s.recompute == "selective"),
        ("a chunked or fused loss or logits_to_keep", c.loss_options), ("offload_activations", s.offload_activations),
        (f"finetune={s.finetune!r}", s.finetune != "full"),
        ("more than one device", s.world_size * s.tp * s.pp * s.cp > 1),
        ("grad_accum_steps > 1", s.grad_accum_steps > 1)))


CACHE_VIEW_FAMILIES = ("gpt2", "gpt_neox", "phi3")
"""Hugging Face families whose layers, once the model has gradient checkpointing on, get no KV cache (GPT2Model
hands ``cache if not (self.gradient_checkpointing and self.training) else None`` to every block; transformers
5.x), so under SDPA an un-checkpointed layer keeps views of its fused q/k/v buffer where without recompute it keeps
the cache's copies: measured with ``recompute_every`` 2 and 3 on the tiny configs (CPU, every family of
memlab.course.hf_configs; the others save exactly what the formula counts), GPT-2 +16 KiB per such layer, GPT-NeoX
-16 KiB, Phi-3 -12 KiB against the rows without recompute. Not modelled: refused, with the trace as the way out."""


def _every_unmodelled(c: Case) -> list[str]:
    s = c.setup
    family = c.config.impl.family if c.is_config else ""  # type: ignore[union-attr]
    return _listed((
        ("pp > 1", s.pp > 1), ("cp > 1", s.cp > 1), ("ep > 1", s.ep > 1),
        (f"finetune={s.finetune!r}", s.finetune != "full"),
        (f"attention_mask={s.attention_mask!r}", s.attention_mask != "none"),
        ("a model whose layers differ (impl.dense_layers)", c.is_config and bool(c.config.impl.dense_layers)),  # type: ignore[union-attr]
        (f"{family}'s fused q/k/v views under SDPA", family in CACHE_VIEW_FAMILIES and s.attention != "eager")))


def _every_line(c: Case) -> str:
    """The assumption of full recompute over every k-th block: which blocks, and where the rule comes from."""
    k = c.setup.recompute_every
    which = ""
    if c.is_config:
        n = c.config.n_layers  # type: ignore[union-attr]
        blocks = checkpointed_blocks(n, k)
        listed = ", ".join(map(str, blocks[:8])) + (", ..." if len(blocks) > 8 else "")
        which = f": blocks {listed} of {n} (from 0)" if blocks else f": none of the {n} blocks"
    how = ("transformers' activation_checkpointing_enable, then the other layers' GradientCheckpointingLayer flag "
           "off (memlab.model.hf.checkpoint_every)" if c.hf else "the reference GPT checkpoints those blocks "
           "(memlab.model.gpt.GPT, recompute_every)")
    return (f"recompute='full' with recompute_every={k}, torchtitan's layer policy (activation_checkpoint.mode="
            f"'selective', selective_ac_option='{k}'): the blocks with (i + 1) % {k} == 0 are checkpointed{which}; "
            "each keeps its input and runs again in backward, the others keep what they keep without recompute "
            "[pytorch/torchtitan@9a8cb98 torchtitan/models/llama3/infra/parallelize.py lines 320-326]; " + how
            + f"; the backward of the lowest checkpointed block (block {k - 1}, the {k - 1} below it holding all they "
            "keep) is taken as one moment, as full recompute's bottom block")


def _op_unmodelled(c: Case) -> list[str]:
    s = c.setup
    return _listed((
        ("a Hugging Face family (the formula counts the reference GPT's projections; the trace runs the family's "
         "own)", c.hf), ("a mixture of experts", c.is_config and c.config.is_moe),  # type: ignore[union-attr]
        ("tp > 1", s.tp > 1), ("pp > 1", s.pp > 1), ("cp > 1", s.cp > 1), ("ep > 1", s.ep > 1),
        ("offload_activations (save_on_cpu does not move what the policy keeps)", s.offload_activations),
        (f"finetune={s.finetune!r}", s.finetune != "full")))


def _op_line(c: Case) -> str:
    """The assumption of torchtitan's per-op policy: what each block keeps, and the source."""
    from memlab.predict.compute.flops import op_policy_kept

    kept = ", ".join(op_policy_kept(c.config)) or "none" if c.is_config else "the 1st, 3rd, ... aten.mm"  # type: ignore[arg-type]
    attention = ("its output and log-sum-exp kept" if c.device_type == "cuda" and c.setup.attention in
                 ("flash", "efficient") else "recomputed")
    return ("recompute='op', torchtitan's per-op policy (activation_checkpoint.mode='selective', "
            "selective_ac_option='op'): every block checkpointed with create_selective_checkpoint_contexts; kept "
            f"beside each block's input: the outputs of the 1st, 3rd, ... aten.mm (here {kept}; a biased projection "
            f"is aten.addmm, not on its list), the fused attention kernel {attention} "
            "[pytorch/torchtitan@9a8cb98 torchtitan/models/llama3/infra/parallelize.py lines 230-240, 291-313; "
            "memlab.model.policies]" + ("; the fused kernel's RNG state tensors (a few bytes a layer) are not "
                                       "counted, not measured on CUDA" if attention.startswith("its") else ""))


def _raised(check: Callable[[], None]) -> str | None:
    """The message of the SetupError ``check`` raises, or None: a family's own refusals, asked as a table row."""
    try:
        check()
    except SetupError as exc:
        return str(exc)
    return None


def _family_refusal(c: Case) -> str | None:
    seq = c.setup.seq if isinstance(c.setup.seq, int) else np.max(c.setup.seq)
    return _raised(lambda: check_family_setup(c.config, c.setup, seq))  # type: ignore[arg-type]


def _padded_cuda_sdpa(c: Case) -> bool:
    return c.train and bool(np.any(padding_present(c.setup, c.setup.batch, c.setup.seq))) \
        and c.setup.attention != "eager" and c.device_type != "cpu"


def _window_reached(c: Case) -> bool:
    window = c.config.impl.sliding_window if c.is_config else None  # type: ignore[union-attr]
    return window is not None and not c.train and bool(np.any(np.asarray(c.setup.seq) >= window))


_LORA = ("lora", "qlora")
QLORA_PRECISIONS = ("bf16", "amp-fp16")
"""The policies QLoRA is modelled under: ``bf16`` (a bf16 model, bnb_4bit_compute_dtype=bfloat16, QLoRA's own
setting [dettmers2023]) and ``amp-fp16`` (the recipe of cards without bf16, a T4: an fp32 model whose block
Linears are NF4 with bnb_4bit_compute_dtype=float16, the forward under fp16 autocast and the loss under
torch.amp.GradScaler, as ``Trainer(fp16=True)`` runs it; fp32 adapters, which GradScaler can unscale)."""
_ADAPTED = (*_LORA, "frozen")

def _adapters_sharded(c: Case) -> str:
    """The refusal of a fine-tune (LoRA, QLoRA, frozen layers) over more than one device, and why: the formula's
    FSDP2 moments (:func:`memlab.predict.memory.fsdp.moments`) count every unit in one dtype with a gradient and a
    reduce-scatter for each parameter, which a peft unit is not."""
    why = (" (its FSDP2 terms count a unit's parameters in one dtype, each with a gradient and a reduce-scatter, "
           "while a fine-tuned unit mixes frozen parameters, QLoRA's 4-bit weights stored as bf16 with their "
           "quantisation state on every rank, and trainable ones, LoRA's fp32 adapters, the only ones with "
           "gradients)" if c.sharded and c.setup.tp == 1 else "")
    return (f"finetune={c.setup.finetune!r} is modelled on one device{why}: set zero_stage=0, "
            "world_size=1, tp=1, or trace it (FSDP2 of a peft model, QLoRA as the FSDP-QLoRA recipe runs it: memlab "
            "estimate --hf answers from the trace; memlab.tracing.hf.trace_hf)")


def _task_refusal(c: Case) -> str:
    task = c.setup.task
    where = ("memlab estimate --hf CONFIG --task {0} answers from the trace of transformers' {0} model (memlab trace "
             "--hf CONFIG --task {0}; memlab.tracing.hf.trace_hf in Python)" if c.hf or not c.is_config else
             "trace a Hugging Face config with that head: memlab trace --hf CONFIG --task {0}").format(task)
    return f"task={task!r}: the formula models a causal LM's head and loss, not a {task} head: {where}"


def _regex_refusal(c: Case) -> str:
    return (f"lora_targets '{c.setup.lora_targets}' is a regex (peft's re.fullmatch on each module's full name) that "
            "the formula has not read as whole kinds in every block: it models adapters on q, k, v, o, gate, up, down "
            "of every block; memlab estimate --hf resolves a regex against the model's module names and answers from "
            "the trace where it selects some blocks only or modules without a kind (the trace passes it to peft as "
            "is; memlab.model.hf.read_lora_regex in Python gives the kinds)")


def _adapter_block_unmodelled(c: Case) -> list[str]:
    """What of a model's block the LoRA rows (memlab.predict.memory.finetune) do not follow, measured against
    trace_hf on every family's tiny config (tests/predict/memory/test_lora_families.py): a parallel attention and
    MLP (falcon, gpt_neox, gptj, phi), norms after the sublayers (gemma2, gemma3, olmo2), norms on q and k (qwen3,
    gemma3, olmo2), and adapters on a fused gate-and-up projection (phi3)."""
    if not c.is_config:
        return []
    im, kinds = c.config.impl, c.setup.lora_target_kinds  # type: ignore[union-attr]
    return _listed((("a parallel attention and MLP", im.parallel_block),
                    (f"norm placement {im.norm_placement}", im.norm_placement != "pre"),
                    ("norms on q and k", im.qk_norm != "none"),
                    ("adapters on the fused gate_up projection", im.fused_gate_up
                     and any(k in ("gate", "up") for k in kinds))))


def _reentrant_refusal(c: Case) -> str:
    """Why the formula refuses torch's reentrant checkpoint (``Setup.checkpoint_reentrant``), and the way out."""
    if not c.hf:
        return ("checkpoint_reentrant is transformers' checkpointing as peft's prepare_model_for_kbit_training leaves "
                "it; the reference GPT checkpoints non-reentrant (memlab.model.gpt): give a Hugging Face config "
                "(memlab estimate --hf answers reentrant from the trace) or drop checkpoint_reentrant")
    return ("checkpoint_reentrant (torch's reentrant CheckpointFunction) is not modelled by the formula: each block "
            "runs again whole in backward, its output included, and backpropagates inside, so a block's backward "
            "holds what the non-reentrant checkpoint the formula models does not (traced on eight families' tiny "
            "configs: backward peaks 512 B to 1.5 block outputs (t x h) higher under full fine-tuning, 0 to one under "
            "LoRA, the same under QLoRA; forward, optimizer step and zero_grad unchanged): trace it (memlab estimate "
            "--hf answers from the trace; memlab.tracing.hf.trace_hf), or drop checkpoint_reentrant for "
            "transformers' default")


def _paged_unmodelled(c: Case) -> list[str]:
    """What a paged optimizer is not modelled with: it pages per tensor on one device (memlab.predict.memory.plan)."""
    s = c.setup
    pure16 = s.policy.param_bytes == 2 and not s.policy.master_bytes
    saved16 = s.finetune in _LORA and bool(s.lora_modules_to_save) and (s.finetune == "qlora" or pure16)
    return _listed((
        ("a bare parameter count (it pages per tensor: give a model config)", not c.is_config),
        ("ZeRO/FSDP sharding over ranks", bool(s.zero_stage) and s.world_size > 1),
        ("pp > 1", s.pp > 1), ("cp > 1", s.cp > 1), ("ep > 1", s.ep > 1),
        ("finetune='frozen'", s.finetune == "frozen"),
        ("16-bit parameters stepped directly (bitsandbytes keeps fp32 states beside them; memlab's stand-in steps "
         "fp32 parameters: use amp-bf16 or a mixed-* policy, or paged-adam-8bit)",
         s.optimizer == "paged-adamw" and ((s.finetune == "full" and pure16) or saved16))))


REFUSALS: tuple[Entry, ...] = (
    Entry("regex targets", lambda c: c.setup.finetune in _LORA and is_target_regex(c.setup.lora_targets),
          refuse=_regex_refusal),
    Entry("a task head", lambda c: c.setup.task not in ("auto", "causal-lm"), refuse=_task_refusal),
    Entry("paged optimizer with", lambda c: c.train and c.setup.optimizer in PAGED_OPTIMIZERS
          and bool(_paged_unmodelled(c)),
          refuse=lambda c: f"optimizer={c.setup.optimizer!r} with {', '.join(_paged_unmodelled(c))} is not "
                           "modelled (bitsandbytes pages each tensor's states on one device): drop that, or use an "
                           "unpaged optimizer (adam-8bit, adamw)"),
    Entry("expert parallelism with", lambda c: c.setup.ep > 1 and bool(_ep_unmodelled(c)),
          refuse=lambda c: f"ep={c.setup.ep} with {', '.join(_ep_unmodelled(c))} is not modelled "
                           "(memlab.predict.parallel.experts): drop it"),
    Entry("pipeline in inference", lambda c: (c.setup.pp > 1 or c.setup.cp > 1) and not c.train,
          refuse="pp and cp are modelled for training: drop them with mode='inference'"),
    Entry("context parallelism needs a fused kernel", lambda c: c.setup.cp > 1 and not c.setup.fused_attention,
          refuse=lambda c: f"cp={c.setup.cp} runs ring attention over a fused kernel: set attention to flash, "
                           f"efficient or cudnn (attention={c.setup.attention!r} keeps s x s scores, not modelled "
                           "under cp)"),
    Entry("pipeline with", lambda c: (c.setup.pp > 1 or c.setup.cp > 1) and bool(_pp_unmodelled(c)),
          refuse=lambda c: f"pp/cp with {', '.join(_pp_unmodelled(c))} is not modelled "
                           "(memlab.predict.parallel.pipeline): drop it"),
    Entry("offload with a chunked loss", lambda c: c.setup.offload_activations and c.setup.loss == "chunked",
          refuse="offload_activations with loss='chunked': each chunk's checkpoint saves the LM-head weight and "
                 "save_on_cpu copies it to the host once per chunk: use loss='fused' (or 'plain') with offload"),
    Entry("FSDP2 mixed precision over 16-bit storage",
          lambda c: c.setup.fsdp_param_dtype != "none" and c.train and c.setup.precision != "fp32",
          refuse=lambda c: f"fsdp_param_dtype gathers fp32 shards in {c.setup.fsdp_param_dtype}: set "
                           f"precision='fp32' (got {c.setup.precision!r}; autocast or 16-bit storage on top of "
                           "MixedPrecisionPolicy is not modelled)"),
    Entry("accumulation with loss options", lambda c: c.setup.grad_accum_steps > 1 and c.reshaped_end,
          refuse="a chunked or fused loss, logits_to_keep or offload_activations with grad_accum_steps > 1 is not "
                 "modelled (the estimate misses up to 45 % of the forward there, benchmarks/estimate_vs_trace.py): "
                 "use grad_accum_steps=1 or the plain loss"),
    Entry("every k-th block with", lambda c: c.setup.recompute_every > 1 and bool(_every_unmodelled(c)),
          refuse=lambda c: f"recompute_every={c.setup.recompute_every} with {', '.join(_every_unmodelled(c))} is not "
                           "modelled: use recompute_every=1 (every block) or trace the setup (memlab trace; memlab "
                           "estimate --hf answers from the trace)"),
    Entry("compile's memory budget", lambda c: c.train and c.setup.activation_memory_budget < 1,
          refuse=lambda c: f"activation_memory_budget={c.setup.activation_memory_budget} is torch.compile's: its "
                           "partitioner chooses what to save from the compiled graph (a knapsack over recompute "
                           "cost; torch._functorch.config, torchtitan's memory_budget mode needs compile), and memlab "
                           "traces eager code: leave it 1 and use a policy memlab models and traces, recompute='op' "
                           "(torchtitan's per-op policy), 'full' (with recompute_every k: every k-th block) or "
                           "'selective'"),
    Entry("torchtitan's op policy with", lambda c: c.setup.recompute == "op" and c.train and bool(_op_unmodelled(c)),
          refuse=lambda c: f"recompute='op' with {', '.join(_op_unmodelled(c))} is not modelled: trace the setup "
                           "(memlab trace; memlab estimate --hf answers from the trace) or use recompute='full'"),
    Entry("chunked loss under full recompute",
          lambda c: c.setup.loss == "chunked" and c.setup.recompute in CHECKPOINTED,
          refuse="loss='chunked' with recompute='full' is not modelled (the estimate misses up to 15 % of the "
                 "forward there, benchmarks/estimate_vs_trace.py): use loss='fused' or another recompute"),
    Entry("FSDP2 output dtype", lambda c: c.setup.fsdp_output_dtype != "none" and c.train,
          refuse=lambda c: f"fsdp_output_dtype={c.setup.fsdp_output_dtype!r} is not modelled: MixedPrecisionPolicy."
                           "output_dtype casts every unit's forward output (a copy per block boundary, saved for "
                           "backward in that dtype), which memlab's activation terms do not count: leave it 'none'"),
    Entry("FSDP2 with loss options", lambda c: c.sharded and c.reshaped_end,
          refuse="a chunked or fused loss, logits_to_keep or offload_activations under FSDP2 (zero_stage >= 2 over "
                 "world_size > 1) is not modelled: the estimate and the trace disagree by up to 43 % there "
                 "(benchmarks/estimate_vs_trace.py): use the plain loss without offload"),
    Entry("frozen blocks' optimizers", lambda c: c.setup.finetune == "frozen" and (
        c.setup.optimizer in ("adam-8bit", "adafactor") or bool(c.setup.policy.master_bytes)),
          refuse=lambda c: "finetune='frozen' is modelled with torch.optim adam/adamw/sgd on fp32, bf16 or amp "
                           f"policies: not optimizer={c.setup.optimizer!r} with precision={c.setup.precision!r}"),
    Entry("QLoRA's compute dtype", lambda c: c.setup.finetune == "qlora"
          and c.setup.precision not in QLORA_PRECISIONS,
          refuse=lambda c: "finetune='qlora' computes in bf16 over a 4-bit base (QLoRA's bnb_4bit_compute_dtype: "
                           "precision='bf16', a bf16 model) or, on cards without bf16 (T4, V100), in fp16 under "
                           "autocast with a GradScaler (precision='amp-fp16': bnb_4bit_compute_dtype=float16, "
                           f"Trainer(fp16=True)): not {c.setup.precision!r}"),
    Entry("LoRA's precision", lambda c: c.setup.finetune in _LORA
          and c.setup.precision not in ("fp32", "bf16", "amp-bf16", "amp-fp16"),
          refuse=lambda c: f"finetune={c.setup.finetune!r} keeps fp32 adapters on a base in the model's dtype: use "
                           f"precision fp32, bf16, amp-bf16 or amp-fp16, not {c.setup.precision!r} (a master-weight "
                           "policy would copy the fp32 adapters again)"),
    Entry("adapters on one device", lambda c: c.setup.finetune in _ADAPTED and (
        bool(c.setup.zero_stage) or c.setup.world_size > 1 or c.setup.tp > 1), refuse=_adapters_sharded),
    Entry("adapters in a block the formula's rows do not follow", lambda c: c.setup.finetune in _LORA
          and bool(_adapter_block_unmodelled(c)),
          refuse=lambda c: f"LoRA on the {c.config.impl.family} block ({', '.join(_adapter_block_unmodelled(c))}) is "
                           "not modelled by the formula: its adapter rows follow a sequential pre-norm block with "
                           "separate gate and up projections (traced on every family's tiny config: these blocks save "
                           "other inputs); trace it (memlab estimate --hf answers from the trace; "
                           "memlab.tracing.hf.trace_hf)"),  # type: ignore[union-attr]
    Entry("adapters on the embedding or the head", lambda c: c.setup.finetune in _LORA
          and any(k in ("embed", "head") for k in c.setup.lora_target_kinds),
          refuse="LoRA on the token embedding or the LM head (lora_targets embed_tokens / lm_head) is not modelled by "
                 "the formula: trace it (memlab estimate --hf answers from the trace; memlab.tracing.hf.trace_hf), "
                 "or train them in full with lora_modules_to_save"),
    Entry("bf16 adapters", lambda c: c.setup.finetune in _LORA and c.setup.lora_dtype != "fp32",
          refuse="lora_dtype='bf16' (adapters, their gradients and Adam moments in bf16, as TRL's SFTTrainer casts a "
                 "k-bit model's) is not modelled by the formula: trace it (memlab estimate --hf answers from the "
                 "trace; memlab.tracing.hf.trace_hf), or keep peft's fp32 adapters"),
    Entry("peft's k-bit preparation", lambda c: c.setup.kbit_prepare,
          refuse="kbit_prepare (peft's prepare_model_for_kbit_training: fp32 embeddings, norms and LM head, whose "
                 "upcasts change every block's saved widths) is not modelled by the formula: trace it (memlab "
                 "estimate --hf answers from the trace; memlab.tracing.hf.trace_hf), or drop kbit_prepare"),
    Entry("reentrant checkpointing", lambda c: c.setup.checkpoint_reentrant, refuse=lambda c: _reentrant_refusal(c)),
    Entry("adapters under selective recompute", lambda c: c.setup.finetune in _ADAPTED
          and c.setup.recompute == "selective",
          refuse=lambda c: f"finetune={c.setup.finetune!r} with recompute='selective' is not modelled (no library "
                           "checkpoints the attention core of a peft model): use recompute='full' (transformers' "
                           "checkpointing) or 'none'"),
    Entry("adapters with loss options", lambda c: c.setup.finetune in _ADAPTED and c.reshaped_end,
          refuse=lambda c: f"finetune={c.setup.finetune!r} with a chunked or fused loss, logits_to_keep or "
                           "offload_activations is not modelled: use the plain loss without offload"),
    Entry("adapters with Adafactor", lambda c: c.setup.finetune in _ADAPTED
          and c.setup.optimizer == "adafactor",
          refuse=lambda c: f"finetune={c.setup.finetune!r} with adafactor is not modelled: use adamw, adam, "
                           "adam-8bit, sgd or sgd-momentum"),
    Entry("a padded batch's kernels", lambda c: c.setup.attention_mask == "padded"
          and c.setup.attention not in ("eager", "flash"),
          refuse=lambda c: f"attention_mask='padded' with attention={c.setup.attention!r} is not measured (only "
                           "eager and CPU SDPA's flash kernel are): use attention='eager' or 'flash'"),
    Entry("a mask with", lambda c: c.setup.attention_mask != "none" and bool(_mask_unmodelled(c)),
          refuse=lambda c: f"attention_mask={c.setup.attention_mask!r} with {', '.join(_mask_unmodelled(c))} is not "
                           "measured (memlab.run.hf.call_inputs): use attention_mask='none' there"),
    Entry("the family's own refusals", lambda c: c.is_config, refuse=_family_refusal),
    Entry("Adafactor on a bare count", lambda c: not c.is_config and c.setup.optimizer == "adafactor" and c.train,
          refuse="adafactor state depends on parameter shapes: give a model config, not a bare count"),
    Entry("a padded batch under CUDA SDPA", _padded_cuda_sdpa,
          refuse=lambda c: f"attention_mask='padded' with attention={c.setup.attention!r} on {c.device_type} is not "
                           "measured (CUDA SDPA's flash kernel takes no explicit mask; the memory-efficient or math "
                           "kernel it falls back to keeps other tensors): use attention='eager', or device cpu"),
    Entry("adapters on a bare count", lambda c: not c.is_config and c.setup.finetune != "full" and c.train,
          refuse=lambda c: f"finetune={c.setup.finetune!r} adapts named modules: give a model config, not a bare "
                           "parameter count"),
    Entry("a sliding window in inference", _window_reached,
          refuse=lambda c: f"{c.config.name}: seq={int(np.max(np.asarray(c.setup.seq)))} reaches its "  # type: ignore[union-attr]
                           f"sliding_window={c.config.impl.sliding_window}: the KV cache then keeps only the "  # type: ignore[union-attr]
                           "window's tokens, which the estimate does not model; use a shorter seq"),
)
"""What memlab refuses, in the order it asks (the first that holds is raised)."""


# -- assumptions and named terms: what an estimate of a modelled case says, and what it leaves out ----------------
def _peak_line(c: Case) -> str:
    s = c.setup
    impl = resolve_optimizer_impl(s.optimizer, s.optimizer_impl, c.device_type)
    return (f"peak = the most held at once over the phases of the first and steady step "
            f"(memlab.predict.memory.phases); optimizer step with the {impl} implementation"
            + (", over model.parameters() in the order the model registers them (a Hugging Face family's "
               "own: memlab.predict.families.order)" if impl == "for-loop" else "")
            + "; fit verdicts use the peak, total is the sum")


def _paged_line(c: Case) -> str:
    """The assumption of a paged optimizer: which states are paged, where they live, and what that means for a fit."""
    bits32 = c.setup.optimizer == "paged-adamw"
    cls, states = ("PagedAdamW32bit", "the two fp32 states") if bits32 else ("PagedAdamW8bit",
                                                                          "the two uint8 states (absmax not)")
    return (f"optimizer={c.setup.optimizer} (bitsandbytes' {cls}): {states} of every tensor of >= 1e5 elements live "
            "in CUDA managed memory (cudaMallocManaged(..., cudaMemAttachHost): [bitsandbytes] 0.50.2 "
            "optim/optimizer.py get_state_buffer l. 374-390, functional.py get_paged l. 91-99, "
            "csrc/pythonInterface.cpp cget_managed_ptr), outside "
            "torch's caching allocator: not in memory_allocated/reserved nor the peak that decides torch's "
            "out-of-memory error, reported apart as paged optimizer states (paged_bytes); prefetched to the device "
            "for each tensor's update (cprefetch, cudaMemPrefetchAsync) and counted by nvidia-smi while resident, "
            "evicted to host RAM by the driver when the allocator needs the room (QLoRA [dettmers2023] Sec. 2): "
            "slower steps, not an error; the step's temporaries are memlab's stand-in's "
            "(memlab.model.optimizers); on a CPU bitsandbytes does not page and the states are plain tensors")


def _stand_in_step_bytes(c: Case) -> float:
    """The temporaries of memlab's stand-in step for a bitsandbytes optimizer (counted in the optimizer step), bytes:
    :func:`memlab.predict.memory.phases.optimizer_temporary_bytes` of its for-loop at the largest tensor (LoRA: the
    largest adapter, fp32), without a master-weight wrapper's gradient copies (those a real step holds too)."""
    from memlab.predict.memory.finetune import largest_adapter_elements
    from memlab.predict.memory.phases import optimizer_temporary_bytes
    from memlab.predict.memory.sharding import shape_summary
    from memlab.predict.spec.precision import precision_policy

    s = c.setup
    if s.finetune in _LORA:
        largest = largest_adapter_elements(c.config, s)  # type: ignore[arg-type]
        return optimizer_temporary_bytes(s.optimizer, "for-loop", precision_policy("fp32"), 0, largest, 3 * largest)
    summ = shape_summary(c.config, s.tp)  # type: ignore[arg-type]
    return optimizer_temporary_bytes(s.optimizer, "for-loop", s.policy, 0, summ.largest_elements,
                                     summ.loop_peak_elements)


def _fsdp_line(c: Case) -> str:
    s, f = c.setup, c.fsdp
    return (f"FSDP2 ({f.units_name} plan, {len(f.units)} units, loss {s.fsdp_loss} the root; "  # type: ignore[union-attr]
            + ("ZeRO-3: units reshard after forward" if s.zero_stage == 3 else
               "ZeRO-2: parameters sharded at rest and gathered from forward to backward (DeepSpeed's "
               "stage 2 keeps full 16-bit parameters at rest: add them)")
            + "): gathered parameters, all-gather buffers, prefetch and unsharded gradients are modelled "
            "per phase (memlab.predict.memory.fsdp); shards padded to ceil(d0 / N) rows as rank 0 holds them")


def _fsdp_moments(c: Case) -> dict[str, tuple[float, tuple[str, ...]]]:
    return fsdp_unmodelled(c.fsdp, c.fsdp.grad_bytes)  # type: ignore[union-attr]


def _fsdp_left_line(c: Case) -> str:
    left = "; ".join(f"{k}: up to {math.ceil(v):,} B ({'/'.join(ph)})" for k, (v, ph) in _fsdp_moments(c).items() if v)
    return f"FSDP2 moments not modelled (memlab.predict.coverage): {left}"


def _fsdp_terms(c: Case) -> list[NamedTerm]:
    return [NamedTerm(k, math.ceil(v), phases, +1) for k, (v, phases) in _fsdp_moments(c).items() if v]


def _loss_line(c: Case) -> str:
    s = c.setup
    return (f"loss={s.loss}" + (f", logits_to_keep={s.logits_to_keep}" if s.logits_to_keep else "")
            + ": the loss's terms follow memlab.model.loss (the fused loss as its pure-torch reference: Liger's kernel "
            "holds less per chunk); chunked's backward is an upper bound; with the loss no longer the largest moment "
            "the backward peak may sit at the bottom layer, whose term is approximate (a few per cent on the "
            "reference GPT; for HF families see benchmarks/loss_options.py)")


CALLS = {
    "none": "the call: model(input_ids, labels=...) with no attention mask",
    "ones": "the call: model(input_ids, attention_mask=ones(b, s), labels=...): transformers builds no mask for SDPA "
            "and the same causal mask for eager, so it saves what the call without a mask saves (measured on CPU "
            "on every tiny HF config, benchmarks/call_conventions.py; not yet on CUDA, assumed the same there as "
            "transformers builds the mask the same way on either)",
    "padded": "the call: a {side}-padded batch, model(input_ids, attention_mask=..., labels=...) with pad_fraction={f} "
              "of the tokens padding (mask 0, labels -100): eager's causal mask changes values, not shapes (it saves "
              "what the call without a mask saves); CPU SDPA keeps the (b, 1, s, s) mask per layer and a GQA "
              "model's repeated K, V (memlab.predict.memory.family_terms.padded_sdpa_rows; measured on CPU on every "
              "tiny HF config, benchmarks/call_conventions.py; SDPA with a padded batch on CUDA is refused)",
}
"""The assumption line naming the call each ``Setup.attention_mask`` describes."""


def call_line(setup: Any) -> str:
    """The assumption naming the call the estimate describes: :data:`CALLS` for ``Setup.attention_mask`` (with
    ``padding_side``), rewritten for a hand-written loss (``Setup.loss_call='manual'``, no ``labels=``)."""
    line = CALLS[setup.attention_mask].format(f=setup.pad_fraction, side=setup.padding_side)
    if setup.attention_mask == "padded":
        line += ("; left padding saves what right padding saves (measured on CPU on every tiny HF config, "
                 "benchmarks/call_conventions.py: no tensor's shape depends on where the zeros sit); a batch where "
                 "floor(pad_fraction b s) is 0 pads no token and is the all-ones call, whose mask transformers "
                 "drops for SDPA (memlab.predict.memory.family_terms.padding_present)")
    if setup.recompute == "full" and setup.attention_mask != "none":
        line += ("; under gradient checkpointing (non-reentrant) a layer keeps its positional arguments only: the mask "
                 "once where the family hands it positionally (GPT-2: eager's causal mask, or under SDPA a padded "
                 "batch's bool mask), never the rotary cos/sin or position ids, passed by keyword "
                 "(memlab.predict.memory.family_terms.checkpoint_mask_rows; measured on CPU on every tiny HF config)")
    if setup.loss_call != "manual":
        return line
    line = line.replace(", labels=...)", ").logits").replace("labels -100", "targets -100")
    how = ("no fp32 upcast: the log-softmax and its total_weight kept in the logits' 16-bit dtype, 2 B/element "
           "instead of transformers' 4" if manual_loss(setup) else
           "the same log-softmax as labels=... (fp32 logits, or fp32 under autocast, whose CPU and CUDA op lists "
           "both run cross_entropy in fp32 [pytorch-amp])")
    return (line + "; the loss hand-written on those logits, F.cross_entropy(logits.view(-1, V), targets.view(-1)) on "
            f"the user's own next-token targets (no shifted, padded copy of the labels): {how} (measured on CPU on "
            "every tiny HF config, benchmarks/call_conventions.py); its forward moment is modelled as transformers' "
            "loss's, less the fp32 final-norm output under autocast, which traces up to 8 b (s + 1) + 16 t h + 16 B "
            "higher (its padded labels and up to four fp32 t x h tensors its forward still holds while its loss runs; "
            "every tiny HF config, benchmarks/call_conventions.py --trace): an upper bound by that much")


def top_block_bound_bytes(config: TransformerConfig, setup: Any, device_type: str = "cuda") -> float:
    """The most the estimate's top-block backward moment can exceed a real step (``StepInputs.top_layer``: under a
    chunked or fused loss or kept positions the top block's temporaries and its gradients are counted all at
    once): one block's backward temporaries plus its gradients on one tp rank, in bytes."""
    return Case(config, setup, device_type).top_block()


def attention_core_bound_bytes(config: TransformerConfig, setup: Any) -> float:
    """The most eager or math (unfused) attention's core holds inside one block's forward beyond its inputs, on one
    tp rank, in bytes: its s x s tensors (scores, mask sum, softmax, dropout) and a few t x h ones, at most
    ``12 S + 4 b s^2 + 22 t h + 4 t`` with ``S = b heads s^2`` (fitted on memlab's trace of the reference GPT, dense
    attention, fp32 and bf16, eager and math, under full and selective recompute; used only as a bound, checked by
    ``tests/studies/test_setup_draws.py`` on generated setups)."""
    b, s_, t = setup.batch, setup.seq, setup.batch * setup.seq
    return (12 * b * config.n_heads * s_ * s_ + 4 * b * s_ * s_ + 22 * t * config.d_model + 4 * t) / setup.tp


def _blocks0(config: TransformerConfig, experts: bool | None = None) -> int:
    """Parameter elements of block 0 (``experts``: only its routed experts' True, only the rest False)."""
    return sum(math.prod(shape) for name, shape, _ in config.param_shapes() if name.startswith("blocks.0.")
               and (experts is None or (".experts." in name) == experts))


def _bottom_block_terms(c: Case) -> list[NamedTerm]:
    """Under full recompute (and under a chunked or fused loss, kept positions or activation offload, where no t x V
    gradient dominates the start of backward) the backward peak is often the bottom block's backward, which the
    estimate takes as one moment: every gradient but the bottom block's, beside its recomputed tensors and
    temporaries. Inside the block's backward its own gradients appear one module at a time (up to the block's
    gradients more: +), and the embeddings' gradients (positions; tokens when untied: a tied one comes from the head)
    are produced only after it, in a first micro-step whose gradients start as None: the phase model leaves them out
    (:attr:`memlab.predict.memory.phases.StepInputs.embedding_grad_bytes`) but under FSDP2, under torchtitan's
    op policy and for an adapter's
    trainable embedding copy, where the estimate counts them (up to their bytes less: -). Sizes on one rank: under
    FSDP2 the unsharded gradients (the gathered dtype), else
    ``grad_bytes / tp``. A Hugging Face family's bottom-block moment need not hide behind a t x V term (measured:
    OPT, one layer, V = 96 beside d_ff and s x s scores), so its terms are always named."""
    config, setup = c.config, c.setup
    gb = c.fsdp.grad_bytes if c.fsdp is not None else setup.policy.grad_bytes / setup.tp
    emb = sum(math.prod(shape) for name, shape, _ in config.param_shapes()  # type: ignore[union-attr]
              if name.startswith("pos_emb.") or (name.startswith("tok_emb.") and not config.tied_embeddings))  # type: ignore[union-attr]
    pol = setup.policy
    why = "full recompute" if setup.recompute in CHECKPOINTED else "the bottom block's moment"
    own = _blocks0(config) * gb  # type: ignore[arg-type]
    if setup.finetune in _LORA:  # only the fp32 adapters get gradients; the frozen embeddings none
        own = 4 * lora_layer_elements(config, setup)  # type: ignore[arg-type]
        emb = emb if "embed" in setup.lora_save_kinds else 0  # (modules_to_save's trainable copy: its gradient)
    elif setup.finetune == "frozen":  # a trained block's gradients; the frozen embeddings none
        emb = 0
    out = [NamedTerm(f"{why}: the bottom block's own gradients inside its backward", math.ceil(own), ("backward",),
                     +1)]
    # the phase model leaves them out of the bottom block's moments (StepInputs.embedding_grad_bytes) but under FSDP2
    # , for an adapter's trainable embedding copy and under torchtitan's op policy
    modelled = c.fsdp is None and setup.finetune not in _LORA and setup.recompute != "op"
    if emb and not modelled and setup.zero_grad_to_none and not (pol.master_bytes and pol.grad_bytes == 4):
        out.append(NamedTerm(f"{why}: the embeddings' gradients, produced after the bottom block's backward",
                             math.ceil(emb * gb), ("backward",), -1, exact=True))
    return out


HF_TRANSIENTS = ("a Hugging Face family's own transients inside forward and backward (norm upcasts, its activation's "
                 "backward, the mask's expansion), where no t x V logits term hides them")
"""The name of the term an HF family gets under the plain loss: bounded by :func:`top_block_bound_bytes` (its
norms' fp32 upcasts, a composed activation's backward, the mask's expansion and the loss's label shift are counted
as the reference GPT's; the t x V logits terms hide them only where the vocabulary is large against the widths:
within 0.1 % at V = 4096, up to several per cent below it at V = 96-512, memlab.studies.hf_draws)."""
HF_RECOMPUTED_BLOCK = ("full recompute of a Hugging Face family: the bottom block's recomputed tensors, counted all at "
                       "once (its backward frees them op by op: an upper bound)")
"""The name of the term an HF family gets under full recompute: one block's saved bytes as without recompute
(measured up to 0.8 x this term below the estimate: memlab.studies.hf_draws, seed 0, 1,140 draws)."""
HF_BOTTOM_TEMPORARIES = ("a Hugging Face family's bottom block: its backward temporaries, counted all at once (its "
                         "block makes and frees them in its own order: an upper bound)")
"""The name of the term every HF family gets in training: ``layer_terms(...)["temp"]``
(:func:`memlab.predict.memory.phases.layer_terms`), backward, -."""


def _core_name(c: Case) -> str:
    return f"full recompute with {c.setup.attention} attention: the attention core's s x s tensors inside a " \
           "recomputed block's "


def _moe_terms(c: Case) -> list[NamedTerm]:
    """A mixture of experts counted as one dense MLP per token: ``top_k`` routed copies of its saved tensors and the
    router's (as without recompute: the copies exist inside a block's forward under any recompute; +), and the
    experts no token chose (no gradient, no optimizer state: up to every expert's gradients and moments, every
    phase, -; under FSDP2 also a gathered block's unsharded expert gradients in backward, -)."""
    config, setup, bd = c.config, c.setup, c.bd
    mlp = bd.activation_detail.get("mlp", 0)  # type: ignore[union-attr]
    if setup.recompute != "none":  # the routed copies still exist while a block's forward runs
        plain = rank_breakdown(config, setup.with_(recompute="none", recompute_every=1), device_type=c.device_type)
        mlp = plain.activation_detail.get("mlp", 0)
    expert = sum(math.prod(shape) for name, shape, _ in config.param_shapes() if ".experts." in name)  # type: ignore[union-attr]
    share = expert / max(1, bd.param_count)  # type: ignore[union-attr]
    out = [NamedTerm("MoE routing (top_k routed copies, router)", math.ceil(config.top_k * mlp),  # type: ignore[union-attr]
                     ("forward", "backward"), +1),
           NamedTerm("MoE experts no token chose (no gradient, no optimizer state)",
                     math.ceil(share * (bd.grads_bytes + bd.optimizer_bytes)),  # type: ignore[union-attr]
                     ("forward", "backward", "optimizer step", "zero_grad"), -1)]
    if c.fsdp is not None:  # a gathered block's unsharded gradients: none for an expert no token chose
        out.append(NamedTerm("MoE experts no token chose: a block's unsharded expert gradients (FSDP2)",
                             math.ceil(_blocks0(config, experts=True) * c.fsdp.grad_bytes), ("backward",), -1))  # type: ignore[arg-type]
    return out


def _dense_layers_line(c: Case) -> str:
    config, setup = c.config, c.setup
    sizes = [0] * config.n_layers  # type: ignore[union-attr]
    for name, shape, _ in config.param_shapes():  # type: ignore[union-attr]
        if name.startswith("blocks."):
            sizes[int(name.split(".")[1])] += math.prod(shape)
    spread = (max(sizes) - min(sizes)) * setup.policy.grad_bytes / setup.tp
    return (f"dense layers {list(config.impl.dense_layers)} among the MoE ones: saved tensors, weights and "  # type: ignore[union-attr]
            f"FLOPs are counted per layer; the peak's one-block moments in backward (a block's gradients) "
            f"take block 0's size, up to {spread:,.0f} B off where the top or bottom block is of the other kind")


def _moe(c: Case, grouped: bool) -> bool:
    return c.is_config and c.config.is_moe and bool(c.config.impl.grouped_experts) == grouped  # type: ignore[union-attr]


def _term(key: str, name: str | Callable[[Case], str], size: Callable[[Case], float], phases: tuple[str, ...],
          sign: int) -> Callable[[Case], list[NamedTerm]]:
    """A one-term ``terms`` factory: ``name`` (or its function of the case), ``size`` in bytes (rounded up)."""
    return lambda c: [NamedTerm(name(c) if callable(name) else name, math.ceil(size(c)), phases, sign, key=key)]


def _kv_line(c: Case) -> str:
    s = c.setup
    kind = ("a dynamic cache (generate()'s default: transformers' DynamicCache when no cache_implementation is set, "
            "generation/utils.py line 2324 of 5.25.0): each layer's keys and values grow by torch.cat every step "
            "(cache_utils.py DynamicLayer.update, lines 136-137), so the prefill holds the prompt's tokens and the "
            "decode step one layer's old values beside the new ones" if s.kv_cache == "dynamic" else
            "a static cache (transformers' StaticCache: preallocated to seq tokens, written in place with index_copy_, "
            "cache_utils.py StaticLayer.update, lines 487-488): the whole cache is held from the prefill on")
    return f"KV cache: seq tokens per sequence (prompt + generated; the prefill runs a prompt of seq - 1), {kind}"


def _inference_line(c: Case) -> str:
    s = c.setup
    keep = ("logits of every prompt position (logits_to_keep=0: a plain forward)" if not s.logits_to_keep else
            "logits of the last position" if s.logits_to_keep == 1 else
            f"logits of the last {s.logits_to_keep} positions")
    default = (" (generate()'s default: it passes logits_to_keep=1 to a model that takes it, transformers "
               "generation/utils.py line 2958 of 5.25.0)" if s.logits_to_keep == 1 else "")
    moe = c.is_config and c.config.is_moe  # type: ignore[union-attr]
    exact = ("a mixture of experts' routing tensors (router logits, token indices, the routed copies) are not "
             "counted: below the trace (memlab.tracing.gpt.trace_gpt with fake=False)" if moe else
             "exact against the reference GPT's trace under a fused kernel (python benchmarks/inference_vs_trace.py; "
             "a Hugging Face family's own activation and norm upcasts are not traced in inference)"
             if s.fused_attention else
             f"attention={s.attention} keeps s x s scores: the prefill and decode moments are a lower bound (eager's "
             "softmax, mask and copies not counted; the fused kernels are exact)")
    return (f"inference: prefill with the {keep}{default}, in the weights' dtype; activations = the prefill's largest "
            f"moment (a block's MLP, its attention, or the head; memlab.predict.memory.inference), {exact}")


CHECKPOINT_VARIANT = (
    "recompute='full' is transformers' per-layer checkpointing, non-reentrant: activation_checkpointing_enable's "
    "default when no kwargs are given, as Trainer(gradient_checkpointing=True) calls it (transformers 5.25 "
    "modeling_utils.py l. 3159-3160); peft's prepare_model_for_kbit_training(model) alone leaves torch's reentrant "
    "checkpoint instead (its kwargs None become {}, peft 0.21 utils/other.py l. 190-191, 253-258, so no use_reentrant "
    "reaches torch 2.13's checkpoint, which then takes use_reentrant=True, torch/utils/checkpoint.py l. 486-496; a "
    "later Trainer(gradient_checkpointing=True) enables it again non-reentrant): that is --reentrant "
    "(checkpoint_reentrant=True), answered by the trace")
"""The assumption naming the checkpoint a Hugging Face model's full recompute runs, and where the other comes from."""


def _train_config(c: Case) -> bool:
    return c.train and c.is_config


TABLE: tuple[Entry, ...] = (
    *REFUSALS,
    Entry("units", lambda c: True, says="bytes per device; GiB = 2**30 B, GB = 1e9 B"),
    Entry("ranks", lambda c: True,
          says=lambda c: f"world_size={c.setup.world_size} counts data-parallel ranks; with tp={c.setup.tp} the job "
                         f"uses {c.setup.world_size * c.setup.tp} device(s)"),
    Entry("optimizer state", lambda c: c.train,
          says="optimizer = moments + fp32 master copy + fp32 grad-accumulation buffer (ZeRO paper's K)"),
    Entry("peak", lambda c: c.train, says=_peak_line),
    Entry("states in the parameter dtype", lambda c: c.train and c.setup.optimizer in (
        "adam", "adamw", "sgd-momentum", "adafactor") and not c.setup.policy.master_bytes
          and c.setup.finetune in ("full", "frozen"),  # LoRA: fp32 adapters and states (memlab.predict.memory.finetune)
          says=lambda c: f"optimizer states in the parameter dtype ({c.setup.policy.param_bytes} B/element) as "
                         "torch.optim"),
    Entry("paged optimizer", lambda c: c.train and c.setup.optimizer in PAGED_OPTIMIZERS, says=_paged_line),
    Entry("bitsandbytes' CUDA step", lambda c: _train_config(c) and c.device_type == "cuda"
          and c.setup.optimizer in PAGED_OPTIMIZERS and c.setup.finetune != "frozen",
          terms=_term("bitsandbytes' CUDA step", "bitsandbytes' CUDA kernels update the states in place: the "
                      "stand-in's step temporaries (memlab.model.optimizers), counted in the optimizer step, are not "
                      "held", _stand_in_step_bytes, ("optimizer step",), -1)),
    Entry("ZeRO over one rank", lambda c: c.train and bool(c.setup.zero_stage) and c.setup.world_size == 1,
          says="ZeRO/FSDP over 1 rank shards nothing"),
    Entry("FSDP2", lambda c: c.train and c.fsdp is not None, says=_fsdp_line),
    Entry("FSDP2 moments", lambda c: c.train and c.fsdp is not None, says=_fsdp_left_line, terms=_fsdp_terms),
    Entry("FSDP2 CPU offload", lambda c: c.train and c.fsdp is not None and c.setup.fsdp_offload,
          says="FSDP2 CPUOffloadPolicy: sharded parameters, gradients and optimizer states on the host (host_bytes; "
               "the optimizer steps there, its temporaries too); the device holds the gathered units, their buffers "
               "and unsharded gradients. A CPU trace cannot tell host from device: memlab.studies.setup_draws checks "
               "device + host against it"),
    Entry("FSDP2 mixed precision", lambda c: c.train and c.fsdp is not None and c.setup.policy.fsdp_mixed,
          says=lambda c: f"MixedPrecisionPolicy(param_dtype={c.setup.policy.fsdp_param_dtype}, reduce_dtype="
                         f"{c.setup.policy.fsdp_reduce_dtype}, output_dtype=None): activations as pure "
                         f"{c.setup.policy.fsdp_param_dtype} compute"),
    Entry("ZeRO-3 under tensor parallelism", lambda c: c.sharded and c.fsdp is None,
          says="tensor parallelism with ZeRO-2/3: FSDP2's gathered parameters are not modelled "
               "(Overheads(gathered_layers=...) adds blocks)"),
    Entry("autocast's copies", lambda c: c.train and c.setup.policy.autocast,
          says="autocast's 16-bit weight copies kept for backward are counted in activations; its cast cache's "
               "copies of the linear biases (saved by no op) in the forward"),
    Entry("every k-th block", lambda c: c.train and c.setup.recompute == "full" and c.setup.recompute_every > 1,
          says=_every_line),
    Entry("torchtitan's op policy", lambda c: c.train and c.setup.recompute == "op", says=_op_line),
    Entry("full recompute's bottom block", lambda c: _train_config(c) and c.setup.recompute in CHECKPOINTED,
          says="full recompute: the bottom block's backward is taken as one moment; its own gradients appearing "
               "inside it and the embeddings' produced after it are named with their sizes (memlab.predict.coverage)"),
    Entry("a base as loaded", lambda c: c.train and c.setup.finetune in _LORA and not c.setup.kbit_prepare,
          says=lambda c: f"finetune={c.setup.finetune!r}: the base as loaded, adapters by peft's get_peft_model "
                         "alone, as TRL's SFTTrainer does since its model-preparation clean-up (huggingface/trl "
                         "2af35fb0d; at f2cd57710 trl/trainer/sft_trainer.py l. 1118-1130 only enables input "
                         "gradients under checkpointing); peft's prepare_model_for_kbit_training (fp32 embeddings, "
                         "norms and head), which SFTTrainer called before it and QLoRA scripts still call, is "
                         "kbit_prepare=True, answered by the trace"),
    Entry("QLoRA in fp16", lambda c: c.train and c.setup.finetune == "qlora" and c.setup.precision == "amp-fp16",
          says="finetune='qlora' under amp-fp16 (cards without bf16, a T4): the model loaded in fp32 (amp-fp16's "
               "weights: embeddings, norms and head 4 B each), its block Linears NF4 computing in fp16 "
               "(bnb_4bit_compute_dtype=float16: each returns its input's fp32 dtype), the forward under fp16 "
               "autocast and the loss under torch.amp.GradScaler (its scale and found-inf scalars, a few bytes, not "
               "counted), fp32 adapters; a model loaded in fp16 instead (torch_dtype=float16, which transformers 4 "
               "set on a 4-bit load given none: quantizers/quantizer_bnb_4bit.py update_torch_dtype) keeps those 2 B "
               "and its MLP tensors in fp16, which neither the formula nor the trace models"),
    Entry("the checkpoint variant", lambda c: c.train and c.setup.recompute == "full" and c.hf,
          says=CHECKPOINT_VARIANT),
    Entry("adapters under checkpointing", lambda c: c.train and c.setup.finetune in _ADAPTED
          and c.setup.recompute == "full",
          says=lambda c: f"finetune={c.setup.finetune!r} under recompute='full' is transformers' per-layer "
                         "checkpointing, non-reentrant (the checkpoint variant above), which makes the frozen "
                         "embeddings' output require a gradient (enable_input_require_grads): "
                         "every block keeps its input and, recomputed in backward, saves what the blocks above the "
                         "bottom one save; frozen weights are cast anew by autocast, not cached"),
    Entry("adapters accumulating", lambda c: c.train and c.setup.finetune in _ADAPTED
          and c.setup.grad_accum_steps > 1,
          says=lambda c: f"finetune={c.setup.finetune!r} with grad_accum_steps={c.setup.grad_accum_steps}: the "
                         "trainable gradients (fp32 adapters' under LoRA) are held from the second micro-batch on; "
                         "each micro-batch saves what one step saves"),
    Entry("loss options", lambda c: c.train and c.loss_options, says=_loss_line),
    Entry("the call", lambda c: c.train and (c.setup.attention_mask != "none" or c.hf),
          says=lambda c: call_line(c.setup)),
    Entry("gelu_new under CUDA autocast", lambda c: c.train and c.hf,
          says=lambda c: cuda_autocast_gelu_note(c.config, c.setup, c.device_type)),  # type: ignore[arg-type]
    # what the phase model takes as one moment: named with its size (the bottom block, the attention core, the top)
    Entry("bottom block", lambda c: _train_config(c) and (c.hf or c.setup.recompute in CHECKPOINTED
                                                          or c.reshaped_end),
          terms=lambda c: [NamedTerm(t.name, t.bytes, t.phases, t.sign, t.exact, key="bottom block")
                           for t in _bottom_block_terms(c)]),
    Entry("HF bottom temporaries", lambda c: c.train and c.hf,
          terms=_term("HF bottom temporaries", HF_BOTTOM_TEMPORARIES,
                      lambda c: max(c.layer("temp"), c.layer("mlp_moment")), ("backward",), -1)),
    Entry("HF recomputed block", lambda c: c.train and c.hf and c.setup.recompute == "full",
          terms=_term("HF recomputed block", HF_RECOMPUTED_BLOCK, lambda c: c.layer("layer"), ("backward",), -1)),
    Entry("recomputed attention core", lambda c: _train_config(c) and c.setup.recompute in CHECKPOINTED
          and not c.setup.fused_attention,
          terms=lambda c: [*_term("recomputed attention core", lambda c: _core_name(c) + "forward",
                                  lambda c: attention_core_bound_bytes(c.config, c.setup), ("forward",), +1)(c),
                           *_term("recomputed attention core", lambda c: _core_name(c) + "backward, counted with the "
                                  "bottom block", lambda c: attention_core_bound_bytes(c.config, c.setup),
                                  ("backward",), -1)(c)]),
    Entry("attention core in forward", lambda c: _train_config(c) and c.setup.recompute not in CHECKPOINTED
          and not c.setup.fused_attention and ((c.setup.recompute == "selective" and c.loss_options)
                                               or c.setup.offload_activations),
          terms=_term("attention core in forward",
                      lambda c: f"{'selective recompute' if c.setup.recompute == 'selective' else 'activation offload'}"
                                f" with {c.setup.attention} attention: the attention core's s x s tensors inside a "
                                "block's forward (not held on the device after it)",
                      lambda c: attention_core_bound_bytes(c.config, c.setup), ("forward",), +1)),
    Entry("offloaded head weight", lambda c: _train_config(c) and c.setup.offload_activations
          and c.setup.loss == "plain",
          terms=_term("offloaded head weight", "activation offload: the LM head's saved weight copied back to the "
                      "device at its backward, beside its gradient",
                      lambda c: c.config.vocab_size * c.config.d_model  # type: ignore[union-attr]
                      * (2 if c.setup.policy.autocast else c.setup.policy.param_bytes) / c.setup.tp,
                      ("backward",), +1)),
    Entry("top block", lambda c: _train_config(c) and c.loss_options and not c.setup.offload_activations
          and (c.setup.recompute not in CHECKPOINTED or c.config.n_layers % c.setup.recompute_every != 0),  # type: ignore[union-attr]
          terms=_term("top block", "the top block's backward moment under a chunked or fused loss or kept positions, "
                      "counted all at once (an upper bound)",
                      lambda c: c.top_block(), ("backward",), -1)),
    Entry("HF transients", lambda c: c.train and c.hf and not c.reshaped_end,
          says="peak: the family's own transients inside forward and backward (norm upcasts, its activation's "
               "backward, the mask's expansion) are the reference GPT's, hidden by the t x V logits terms at a large "
               "vocabulary; where they are not, named with their bound (memlab.predict.coverage; real steps: "
               "python benchmarks/hf_draws.py)",
          terms=_term("HF transients", HF_TRANSIENTS,
                      lambda c: c.top_block(), ("forward", "backward"), +1)),
    Entry("offloaded bottom block", lambda c: _train_config(c) and c.setup.offload_activations
          and (c.setup.recompute not in CHECKPOINTED or c.setup.recompute_every > 1),  # block 0 checkpointed at k = 1
          terms=_term("offloaded bottom block", "activation offload: the bottom block's saved tensors, counted on the "
                      "device at once at its backward (they come back from the host one op at a time: an upper "
                      "bound)", lambda c: c.layer("layer"), ("backward",), -1)),
    Entry("activation offload", lambda c: c.train and c.setup.offload_activations,
          says="activation offload (save_on_cpu, pinned): the device keeps the token ids and the loss's tensors while "
               "it runs; host_bytes is a lower bound (tensors saved twice are copied twice)"),
    Entry("bounded phases", lambda c: c.train and c.reshaped_end,
          says="a chunked or fused loss, kept positions or activation offload: the phases not modelled exactly are "
               "bounded by the terms memlab.predict.coverage names, with their sizes (checked on generated setups: "
               "python benchmarks/estimate_vs_trace.py --loss-draws 40)"),
    Entry("inference weights", lambda c: not c.train,
          says="inference: weights replicated over data-parallel ranks (ZeRO does not apply); no grads/states"),
    Entry("KV cache", lambda c: not c.train, says=_kv_line),
    Entry("inference activations", lambda c: not c.train, says=_inference_line),
    Entry("generate()'s fp32 logits", lambda c: not c.train and c.is_config,
          terms=_term("generate()'s fp32 logits", "generate()'s fp32 copy of the next token's logits "
                      "(outputs.logits[:, -1].to(copy=True, dtype=torch.float32), transformers generation/utils.py, "
                      "line 3251 of 5.25.0): b x vocab x 4 bytes beside the model's logits",
                      lambda c: 4 * c.setup.batch * c.config.vocab_size / c.setup.tp,  # type: ignore[union-attr]
                      ("prefill", "decode"), +1)),
    Entry("grouped experts", lambda c: _moe(c, grouped=True),
          says=lambda c: f"mixture of experts ({c.config.impl.family}): the router's and the top_k routed (token, "  # type: ignore[union-attr]
                         "expert) pairs' saved tensors are counted exactly (sized by tokens x top_k, whatever the "
                         f"routing); all {c.config.n_experts} experts' weights, grads and states are resident (two "  # type: ignore[union-attr]
                         "3-D tensors a layer)"),
    Entry("dense layers among experts", lambda c: _moe(c, grouped=True) and bool(c.config.impl.dense_layers),  # type: ignore[union-attr]
          says=_dense_layers_line),
    Entry("MoE routing", lambda c: _moe(c, grouped=False),
          says="mixture of experts: routing activations and unchosen experts are named with their sizes "
               "(memlab.predict.coverage)",
          terms=lambda c: [NamedTerm(t.name, t.bytes, t.phases, t.sign, t.exact, key="MoE routing")
                           for t in _moe_terms(c)] if c.train else []),
    Entry("MoE experts resident", lambda c: _moe(c, grouped=False),
          says=lambda c: f"mixture of experts: all {c.config.n_experts} experts' weights (and their grads and states) "  # type: ignore[union-attr]
                         "are resident; activations are counted as for one dense MLP per token (the top_k routed "
                         "copies are not modelled yet)"),
    Entry("bare count", lambda c: not c.is_config,
          says="bare parameter count: activations and KV cache need a model config and are 0 here"),
    Entry("CUDA context", lambda c: not c.overheads.cuda_context_bytes, tail=True,
          says="CUDA context not included (a few hundred MB; PyTorch maintainers cite ~300-400 MB with lazy loading, "
               "pytorch/pytorch#107667, #109888): measure NVML used minus torch.cuda.memory_reserved() after the "
               "first CUDA op and pass Overheads(cuda_context_bytes=...)"),
    Entry("workspaces", lambda c: not c.overheads.workspace_bytes, tail=True,
          says="cuBLAS/attention workspaces not included: pass Overheads(workspace_bytes=...)"),
    Entry("fragmentation", lambda c: not c.overheads.fragmentation_fraction, tail=True,
          says="allocator fragmentation not included: measure (reserved - allocated) / allocated at the peak "
               "(torch.cuda.memory_stats) and pass Overheads(fragmentation_fraction=...)"),
)
"""What memlab models, in one table: :data:`REFUSALS` first, then each modelled case's assumption and the terms it
names, in the order an estimate prints them."""


# -- the views ----------------------------------------------------------------------------------------------------
def refusal(config: TransformerConfig | int, setup: Any, device_type: str = "cuda") -> str | None:
    """The first refusal of :data:`TABLE` that holds for the case (its message, with the way out), or None when
    memlab models it."""
    case = Case(config, setup, device_type)
    for entry in REFUSALS:
        if entry.when(case):
            message = entry.text(entry.refuse, case)
            if message:
                return message
    return None


def check(config: TransformerConfig | int, setup: Any, device_type: str = "cuda") -> None:
    """Raise :class:`~memlab.errors.SetupError` (one line: :func:`refusal`) for a case memlab does not model."""
    message = refusal(config, setup, device_type)
    if message:
        raise SetupError(message)


_BASE = Setup()


@functools.lru_cache(maxsize=1024)
def _said(config: TransformerConfig | int, rest: tuple, overheads: Any, device_type: str) -> tuple[tuple, tuple]:
    setup = SetupView(_BASE, batch=None, seq=None, **dict(zip(REST_FIELDS, rest, strict=True)))
    case = Case(config, setup, device_type, overheads)
    head: list[str] = []
    tail: list[str] = []
    for entry in TABLE:
        if entry.says is not None and entry.when(case):
            line = entry.text(entry.says, case)
            if line:
                (tail if entry.tail else head).append(line)
    return tuple(head), tuple(tail)


def clear_cache() -> None:
    """Forget the cached assumption lists (the speed benchmark times them from cold)."""
    _said.cache_clear()


def assumptions(config: TransformerConfig | int, setup: Any, overheads: Any, device_type: str = "cuda"
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The assumption sentences of :data:`TABLE` for the case, in table order: those before the seq-dependent note
    (:func:`rotary_seq_note`) and those after it (the overheads not included). They read no batch or seq, so they
    are listed once per (model, setup but batch and seq, overheads, device) and cached."""
    return _said(config, tuple(getattr(setup, name) for name in REST_FIELDS), overheads, device_type)


def rotary_seq_note(config: TransformerConfig | int, seq: int) -> tuple[str, ...]:
    """The assumption a rotary model run beyond its trained length adds (between the head and the tail)."""
    if isinstance(config, int) or config.positions != "rotary" or seq <= config.max_seq:
        return ()
    return (f"seq={seq} exceeds the model's trained max_seq={config.max_seq} (rotary: runs, quality aside)",)


def named_terms(config: TransformerConfig | int, setup: Any, bd: MemoryBreakdown, device_type: str = "cuda"
                ) -> tuple[NamedTerm, ...]:
    """What the estimate ``bd`` of the case leaves out, each with the most it can add or take away, in bytes, the
    phases it applies to and its sign: the ``terms`` of :data:`TABLE`'s entries that hold, in table order, sized
    with ``bd``'s widths (``device_type``). Empty where the estimate claims everything it counts."""
    case = Case(config, setup, device_type, bd=bd)
    out: list[NamedTerm] = []
    for entry in TABLE:
        if entry.terms is not None and entry.when(case):
            out += [t if t.key else NamedTerm(t.name, t.bytes, t.phases, t.sign, t.exact, key=entry.key)
                    for t in entry.terms(case)]
    return tuple(out)


def peak_range(bd: MemoryBreakdown, terms: tuple[NamedTerm, ...] | None = None, step: str | None = None) -> PeakRange:
    """The real peak's range from the estimate's phases and the terms it names: each phase holds at most its
    estimate plus the terms that may add to it and at least its estimate less those that may take away, so the real
    peak (the largest phase) is at most the largest of the upper ends and at least the largest of the lower ends.
    Bytes; exact (``low == high``) where nothing is named. ``step``: ``first`` or ``steady`` for that step's peak
    only (default: the estimate's peak, over both). ``terms``: the estimate's own (``bd.named_terms``) unless
    given."""
    terms = bd.named_terms if terms is None else terms
    rows = [r for r in bd.phases if step is None or r.step == step]
    peak = max((r.held_bytes for r in rows), default=bd.peak_bytes) if step is not None else bd.peak_bytes
    if not terms or not rows:
        return PeakRange(int(peak), int(peak), int(peak), ())
    high = low = 0
    for row in rows:
        more = sum(t.bytes for t in terms if t.sign > 0 and t.applies(row.phase))
        less = sum(t.bytes for t in terms if t.sign < 0 and t.applies(row.phase))
        high, low = max(high, row.held_bytes + more), max(low, row.held_bytes - less)
    return PeakRange(int(peak), int(min(low, peak)), int(max(high, peak)), tuple(terms))
