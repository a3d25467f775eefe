"""FLOP counts for transformers, and model / hardware FLOPs utilisation (MFU / HFU).

Counting convention (every function here): a matmul of an (m x k) by a (k x n) matrix costs 2*m*n*k FLOPs (one
multiply and one add per term). Only matmuls are counted: norms, softmax, activations, biases, residual adds,
dropout and the embedding lookup are left out, as in the papers below, which is why 6N (and not "6 x every
parameter") is the training cost of N matmul weights. The backward pass of a matmul is two matmuls of the same
size (input gradient and weight gradient), so training = 3 x forward (Narayanan et al. 2021, Appendix).

Sources:

- PaLM: Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Appendix B: training FLOPs per
  token 6N + 12*L*H*Q*T, and MFU = achieved tokens/s x FLOPs per token / peak FLOP/s.
- Megatron: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Appendix "Floating-Point Operations", Eq. (3): 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per
  iteration with full activation recomputation.
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Section 6 and
  Appendix A: model FLOPs 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)); hardware FLOPs with selective recomputation
  printed as 72*B*s*l*h^2*(1 + s/(3h) + V/(12*l*h)) (see :func:`megatron_closed_form` on that s/(3h)).

No torch import; numbers only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any

from memlab.errors import ConfigError, SetupError, unknown_name
from memlab.predict.hardware.gpus import PEAK_DTYPES, Accelerator, DeviceInfo, gpu
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import RECOMPUTE, Recompute, Setup, checkpointed_blocks
from memlab.predict.spec.validate import LIMITS, canonical_choice, check_int, check_number

_pos_int = functools.partial(check_int, err=SetupError)
"""A count (batch, seq, dims) >= 1, or the :class:`SetupError` naming it (``err=ConfigError`` for a model's)."""


def _bounded(name: str, value: object) -> int:
    """A batch, seq or num_devices count in [1, its :data:`~memlab.predict.spec.validate.LIMITS` bound], so no product
    of counts overflows a float (``flops_per_token(cfg, 10**400)`` is refused, not an OverflowError)."""
    limit = LIMITS[{"num_devices": "devices"}.get(name, name)]
    return check_int(name, value, hi=int(limit.max), why=limit.why, err=SetupError)


_pos_num = functools.partial(check_number, lo=0.0, lo_open=True, err=SetupError)
"""A finite number > 0 (seconds, a parameter count)."""


def _check_recompute(recompute: str) -> str:
    recompute = canonical_choice(recompute, RECOMPUTE)
    if recompute not in RECOMPUTE:
        raise SetupError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    return recompute


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: 2*m*n*k (a multiply and an add per term; Narayanan et al. 2021)."""
    return 2 * _pos_int("m", m) * _pos_int("n", n) * _pos_int("k", k)


def attention_flops(batch: int, seq: int, d_model: int, n_heads: int | None = None, *, causal: bool = False) -> int:
    """Forward FLOPs of one layer's attention core, QK^T and softmax(.)V: 2 x 2*b*s*s*h.

    Per query head both products are (s x d_head) by (d_head x s) sized, and the heads together span
    h = n_heads * d_head = ``d_model``, so the count does not depend on ``n_heads`` (given, it is only checked to
    divide ``d_model``); GQA shares K/V heads but not this work. ``causal=False`` counts the full s x s score
    matrix, as PaLM's 12*L*H*Q*T and Megatron's 4*B*s^2*h do. ``causal=True`` counts the useful half
    (2*b*s*s*h), the convention of FlashAttention's benchmarks (Dao 2023), whose kernels skip masked blocks.
    """
    b, s, h = _bounded("batch", batch), _bounded("seq", seq), _pos_int("d_model", d_model)
    if n_heads is not None and h % _pos_int("n_heads", n_heads):
        raise ConfigError(f"n_heads={n_heads} must divide d_model={d_model}")
    full = 4 * b * s * s * h
    return full // 2 if causal else full


def forward_flops_breakdown(config: TransformerConfig, batch: int, seq: int, causal: bool = False) -> dict[str, int]:
    """Forward FLOPs of every matmul in ``config``'s model, by component (exact, integers).

    - ``attention_proj``: per layer Q and O (h x n_heads*head_dim, which is h x h unless the model sets its own
      head width: Gemma, Qwen3-MoE), K and V (h x n_kv_heads*head_dim: GQA/MQA narrow them)
    - ``attention_core``: per layer QK^T and AV (:func:`attention_flops` over the heads' n_heads*head_dim)
    - ``mlp``: per layer up and down (gelu) or gate, up and down (swiglu), all h x d_ff; a mixture of experts
      runs that for each of its ``active_experts`` (top_k routed + shared) plus the h x n_experts router, and
      a gated shared expert of its own width (``impl.shared_expert_ff``, Qwen2-MoE) with its h x 1 gate; dense
      layers among the MoE ones (``impl.dense_layers``) run one MLP of width ``impl.dense_ff`` instead
    - ``head``: the LM head, h x vocab (tied or not: it is multiplied either way)

    Embedding lookups, norms, biases, activations and softmax are not matmuls and are not counted.
    """
    if not isinstance(config, TransformerConfig):
        raise ConfigError(f"config must be a TransformerConfig, got {type(config).__name__}")
    tokens = _bounded("batch", batch) * _bounded("seq", seq)
    h, q, kv, f, n_layers = config.d_model, config.q_dim, config.kv_dim, config.ffn, config.n_layers
    proj = matmul_flops(tokens, q, h) + matmul_flops(tokens, h, q) + 2 * matmul_flops(tokens, kv, h)
    n_in = 1 if config.mlp == "gelu" else 2
    mlp = (n_in * matmul_flops(tokens, f, h) + matmul_flops(tokens, h, f)) * config.active_experts
    if config.is_moe:
        mlp += matmul_flops(tokens, config.n_experts, h)
    sf = config.impl.shared_expert_ff  # Qwen2-MoE's gated shared expert (its own width) and its (1, h) gate
    if sf:
        mlp += 2 * matmul_flops(tokens, sf, h) + matmul_flops(tokens, h, sf) + matmul_flops(tokens, 1, h)
    mlps = n_layers * mlp
    if config.impl.dense_layers:  # Qwen2-MoE's dense layers among the MoE ones: one MLP dense_ff wide each
        df = config.impl.dense_ff
        dense = n_in * matmul_flops(tokens, df, h) + matmul_flops(tokens, h, df)
        mlps = config.moe_layers * mlp + len(config.impl.dense_layers) * dense
    return {
        "attention_proj": n_layers * proj,
        "attention_core": n_layers * attention_flops(batch, seq, q, config.n_heads, causal=causal),
        "mlp": mlps,
        "head": matmul_flops(tokens, config.vocab_size, h),
    }


def forward_flops(config: TransformerConfig, batch: int, seq: int, causal: bool = False) -> int:
    """Forward FLOPs of one batch (every matmul, counted exactly): the sum of :func:`forward_flops_breakdown`.

    Equals 2 * ``config.matmul_param_count()`` * batch * seq + n_layers * attention_flops(...) for a dense model;
    for a mixture of experts only the active experts' weights count (``config.active_param_count()``).
    """
    return sum(forward_flops_breakdown(config, batch, seq, causal).values())


def decode_flops(config: TransformerConfig, batch: int, context: int) -> int:
    """FLOPs of one decode step: each of ``batch`` sequences runs one new token against ``context`` cached ones.

    Every matmul weight once per token (2 x the weights a token multiplies: ``matmul_param_count`` less the
    routed experts it skips; the embedding lookup is not a matmul) plus, per layer, QK^T and AV of one query over
    ``context`` keys, 2 x 2 x context x n_heads*head_dim per sequence (Kaplan et al. 2020's 2N + 2 n_layer n_ctx
    d_attn forward count [kaplan2020], with both attention products). Integers, exact for the matmuls memlab counts."""
    if not isinstance(config, TransformerConfig):
        raise ConfigError(f"config must be a TransformerConfig, got {type(config).__name__}")
    b, ctx = _bounded("batch", batch), _bounded("seq", context)  # a context has the limits of a seq
    weights = config.matmul_param_count() - config.inactive_expert_params(matmul_only=True)
    return 2 * weights * b + config.n_layers * 4 * b * ctx * config.q_dim


def flops_per_token(config: TransformerConfig, seq: int, *, include_attention: bool = True,
                    exclude_embeddings: bool = True) -> float:
    """Training FLOPs per token by the PaLM formula 6N + 12*L*H*Q*T (Chowdhery et al. 2022, Appendix B).

    ``exclude_embeddings=True`` (default): N = ``config.matmul_param_count()``, the weights that are multiplied:
    every projection in the blocks plus the LM head (counted once, tied or not). Excluded: the token-embedding
    lookup of an untied model, learned position tables, norm weights and biases. This makes 6N + attention
    equal 3 x :func:`forward_flops` / tokens exactly (for a mixture of experts, N leaves out the routed experts a
    token skips). ``exclude_embeddings=False``: N = ``param_count()`` (the
    "6 x all parameters" habit, which overcounts looked-up tables). ``include_attention=False`` drops
    12*L*H*Q*T. Attention is counted non-causal, as in PaLM.
    """
    if not isinstance(config, TransformerConfig):
        raise ConfigError(f"config must be a TransformerConfig, got {type(config).__name__}")
    n = config.matmul_param_count() if exclude_embeddings else config.param_count()
    n -= config.inactive_expert_params(matmul_only=exclude_embeddings)  # a token multiplies only its experts
    attention = 12 * config.n_layers * config.n_heads * config.head_dim * _bounded("seq", seq)
    return float(6 * n + (attention if include_attention else 0))


def block_projections(config: TransformerConfig) -> list[tuple[str, int, int, bool]]:
    """``(name, inputs, outputs, biased)`` of one block's projections in the order the reference GPT calls them
    (q, k, v, o, then gate, up, down or up, down; memlab.model.gpt): a biased one runs as ``aten.addmm`` on a 3-D
    input, an unbiased one as ``aten.mm`` (aten/src/ATen/native/Linear.cpp), which torchtitan's per-op policy
    counts (memlab.model.policies). Dense blocks only (a mixture of experts' are the router's and each expert's)."""
    im, h, f, q, kv = config.impl, config.d_model, config.ffn, config.q_dim, config.kv_dim
    qkv_b, o_b, mlp_b = (config.bias if x is None else x for x in (im.qkv_bias, im.o_bias, im.mlp_bias))
    mlp = [("gate", h, f, mlp_b), ("up", h, f, mlp_b)] if config.mlp == "swiglu" else [("up", h, f, mlp_b)]
    return [("q", h, q, qkv_b), ("k", h, kv, qkv_b), ("v", h, kv, qkv_b), ("o", q, h, o_b), *mlp,
            ("down", f, h, mlp_b)]


def op_policy_kept(config: TransformerConfig) -> list[str]:
    """The projections whose outputs torchtitan's per-op policy keeps in each block: the 1st, 3rd, ... ``aten.mm``
    (unbiased projections counted in call order) [pytorch/torchtitan@9a8cb98
    torchtitan/models/llama3/infra/parallelize.py lines 291-302]."""
    kept, n = [], 0
    for name, _, _, biased in block_projections(config):
        n += not biased
        if not biased and n % 2 == 1:
            kept.append(name)
    return kept


def recomputed_flops(config: TransformerConfig, batch: int, seq: int, recompute: Recompute = "none", *,
                     recompute_every: int = 1, causal: bool = False, attention_kept: bool = True) -> int:
    """FLOPs run a second time in backward by a recompute policy (what HFU counts beyond MFU):

    - ``none`` 0; ``selective`` the attention core (QK^T and AV; Korthikanti et al. 2022, Section 5);
    - ``full`` every checkpointed block's forward: all of them, or with ``recompute_every`` k the blocks with
      (i + 1) divisible by k (their share of the blocks' forward; the layers alike);
    - ``op`` (torchtitan's per-op policy) every block's projections but the kept ones (:func:`op_policy_kept`),
      and the attention core unless its kernel's output is kept (``attention_kept``: CUDA's flash or
      memory-efficient SDPA, on the policy's list; eager's matmuls and CPU's flash kernel are not).
    """
    parts = forward_flops_breakdown(config, batch, seq, causal)
    recompute = _check_recompute(recompute)
    blocks = sum(parts.values()) - parts["head"]
    if recompute == "full":
        n = config.n_layers
        return blocks * len(checkpointed_blocks(n, recompute_every)) // n
    if recompute == "op":
        tokens = batch * seq
        kept = set(op_policy_kept(config))
        again = sum(matmul_flops(tokens, n_out, n_in) for name, n_in, n_out, _ in block_projections(config)
                    if name not in kept)
        return config.n_layers * again + (0 if attention_kept else parts["attention_core"])
    return {"none": 0, "selective": parts["attention_core"]}[recompute]


def megatron_iteration_flops(config: TransformerConfig, batch: int, seq: int, recompute: Recompute = "none",
                             causal: bool = False, recompute_every: int = 1) -> int:
    """FLOPs one training iteration executes, by explicit matmul counting (generalises Narayanan / Korthikanti).

    From the forward count F (:func:`forward_flops_breakdown`, GQA, gelu/swiglu and any d_ff):

    - ``none``: 3F (forward, and a backward of twice the forward): Korthikanti et al. 2022's model FLOPs.
    - ``full``: 3F + F_blocks: every transformer block runs its forward again before its backward, the LM head
      does not (Narayanan et al. 2021, Eq. 3, counts the logit layer 3x and the layers 4x).
    - ``selective``: 3F + F_attention_core: only QK^T, softmax and AV are recomputed (Korthikanti et al. 2022,
      Section 5). This is what the GPU executes; Korthikanti's printed equation counts more (see
      :func:`megatron_closed_form`).
    - ``full`` with ``recompute_every`` k, and ``op``: 3F + :func:`recomputed_flops` (``op`` with the fused
      attention kernel's output kept, as torchtitan runs it on CUDA).

    For a GPT layout (d_ff = 4h, multi-head, 2-matrix MLP, non-causal) this equals the published closed forms
    for ``none`` and ``full`` exactly; both leave out the same non-matmul work.
    """
    forward = forward_flops(config, batch, seq, causal)
    return 3 * forward + recomputed_flops(config, batch, seq, recompute, recompute_every=recompute_every,
                                          causal=causal)


def megatron_closed_form(batch: int, seq: int, n_layers: int, d_model: int, vocab_size: int,
                         recompute: Recompute = "none") -> float:
    """The published per-iteration closed forms, verbatim (GPT layout: d_ff = 4h, multi-head, full s x s scores).

    - ``none``: 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) (Korthikanti et al. 2022, model FLOPs).
    - ``full``: 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) (Narayanan et al. 2021, Eq. 3).
    - ``selective``: 72*B*s*l*h^2*(1 + s/(3h) + V/(12*l*h)) (Korthikanti et al. 2022, hardware FLOPs).

    Note on ``selective``: s/(3h) adds 12*B*s^2*h*l over the model FLOPs, three times the 4*B*s^2*h*l that one
    more forward of QK^T and AV costs. Their Table 5 (MFU 51.4 % vs HFU 52.8 % for GPT-3) follows the printed
    form. :func:`megatron_iteration_flops` counts the recomputation once, 8*B*s^2*h*l below this.
    """
    b, s = _bounded("batch", batch), _bounded("seq", seq)
    n_l, h, v = (_pos_int(k, x, hi=int(LIMITS[lim].max), why=LIMITS[lim].why, err=ConfigError)
                 for k, x, lim in (("n_layers", n_layers, "layers"), ("d_model", d_model, "d_model"),
                                   ("vocab_size", vocab_size, "vocab")))
    base = b * s * n_l * h * h
    forms = {
        "none": 72 * base * (1 + s / (6 * h) + v / (12 * n_l * h)),
        "full": 96 * base * (1 + s / (6 * h) + v / (16 * n_l * h)),
        "selective": 72 * base * (1 + s / (3 * h) + v / (12 * n_l * h)),
    }
    recompute = _check_recompute(recompute)
    if recompute not in forms:
        raise SetupError(f"the published closed forms are for recompute none, selective and full, not {recompute!r}: "
                         "use megatron_iteration_flops")
    return forms[recompute]


# -- a fine-tuning step ---------------------------------------------------------------------------------------
_STAGES = ("qkv", "core", "o", "mlp_in", "down")
"""A block's matmuls bottom-up, in the order its forward runs them (the gradient meets them top-down)."""
_STAGE_OF = {"q": 0, "k": 0, "v": 0, "qkv": 0, "o": 2, "gate": 3, "up": 3, "down": 4}
"""The stage (:data:`_STAGES` index) of each adapted module kind (memlab.predict.spec.setup.LORA_KINDS)."""


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step's matmuls, by where they run (integers; the counting convention of this module).

    ``forward``: every matmul once (adapters included). ``backward_input``: the input-gradient GEMMs (and the
    attention core's backward, whose operands are all activations) of the layers the gradient passes through.
    ``backward_weight``: the weight-gradient GEMMs of trainable weights only. ``recompute``: the forward run again
    under the setup's recompute (hardware FLOPs only). ``model`` is the work the step needs (MFU's numerator, PaLM
    Appendix B [chowdhery2022]: no recomputation); ``hardware`` adds the recompute (HFU, Korthikanti et al. 2022).
    """

    forward: int
    backward_input: int
    backward_weight: int
    recompute: int
    tokens: int

    @property
    def model(self) -> int:
        """The step's work: forward + both backward GEMM sets (FLOPs)."""
        return self.forward + self.backward_input + self.backward_weight

    @property
    def hardware(self) -> int:
        """What the GPU executes: :attr:`model` + :attr:`recompute` (FLOPs)."""
        return self.model + self.recompute


def adapter_shapes(config: TransformerConfig, targets: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """``(kind, in_features, out_features)`` of each Linear of one block that LoRA adapts (``targets`` from
    :data:`~memlab.predict.spec.setup.LORA_KINDS`; a fused QKV projection once, as ``qkv``), read from block 0's
    weight shapes (``config.param_shapes()``: (out, in)). A kind the model has no weight of (``gate`` on a GELU MLP)
    raises :class:`ConfigError`. Equals :func:`memlab.predict.memory.finetune.lora_modules` (tested)."""
    weights = {name.split(".")[-2]: shape for name, shape, _ in config.param_shapes()
               if name.startswith("blocks.0.") and name.endswith(".weight") and len(shape) == 2}
    out: list[tuple[str, int, int]] = []
    if "qkv" in weights and any(k in targets for k in ("q", "k", "v")):
        out.append(("qkv", weights["qkv"][1], weights["qkv"][0]))
    for kind in ("q", "k", "v", "o", "gate", "up", "down"):
        if kind not in targets or (kind in ("q", "k", "v") and "qkv" in weights):
            continue
        if kind not in weights:
            raise ConfigError(f"lora_targets names {kind!r}, but this model's blocks have no {kind} projection "
                              f"(its MLP is {config.mlp}): use up and down")
        out.append((kind, weights[kind][1], weights[kind][0]))
    return out


def _block_stages(config: TransformerConfig, batch: int, seq: int, causal: bool) -> dict[str, int]:
    """Forward FLOPs of one dense block's matmuls by stage (:data:`_STAGES`), as :func:`forward_flops_breakdown`
    counts them."""
    t = batch * seq
    h, q, kv, f = config.d_model, config.q_dim, config.kv_dim, config.ffn
    return {"qkv": matmul_flops(t, q, h) + 2 * matmul_flops(t, kv, h),
            "core": attention_flops(batch, seq, q, config.n_heads, causal=causal), "o": matmul_flops(t, h, q),
            "mlp_in": (1 if config.mlp == "gelu" else 2) * matmul_flops(t, f, h), "down": matmul_flops(t, h, f)}


def _input_grads(stages: dict[str, int], adapters: list[tuple[str, int, int]], rank: int, t: int,
                 lowest: int) -> int:
    """Input-gradient FLOPs of one block whose stages from ``lowest`` up are passed by the gradient: each base
    matmul above ``lowest`` once (dX = dY W^T, the forward's size), the attention core twice (dQ, dK, dV and the
    scores' gradient: four products of the forward's two sizes, as SDPA's backward computes them), and per adapter
    above ``lowest`` 2*t*r*(in + out) (through B, then A); an adapter at ``lowest`` only through B (2*t*r*out: its
    A needs it for its weight gradient), as its input, like its base matmul's, carries no gradient."""
    base = sum(v * (2 if name == "core" else 1) for i, (name, v) in enumerate(stages.items()) if i > lowest)
    lora = sum(2 * t * rank * ((i if _STAGE_OF[k] > lowest else 0) + o) for k, i, o in adapters
               if _STAGE_OF[k] >= lowest)
    return base + lora


def step_flops(config: TransformerConfig, setup: Any, causal: bool = False) -> StepFlops:
    """FLOPs of one training step of ``setup.batch`` x ``setup.seq`` tokens under ``setup.finetune`` and
    ``setup.recompute`` (a :class:`~memlab.predict.spec.setup.Setup`), every matmul counted exactly.

    - ``full``: forward F, backward 2F (an input- and a weight-gradient GEMM per matmul), recompute as
      :func:`megatron_iteration_flops` counts it (Megatron's whole-layer recompute, the papers' MFU convention).
    - ``lora``/``qlora`` (adapters of rank r on ``setup.lora_target_kinds`` in every block, Hu et al. 2021
      [hu2021]: W x + B A x with A r x in and B out x r; QLoRA's NF4 base is dequantised and multiplied as LoRA's):
      forward F plus 2*t*r*(in + out) per adapter; backward: the input-gradient GEMMs of every block (the adapters
      sit in all of them), in block 0 only above its lowest adapted stage (the embedding and the norms are frozen,
      so nothing below it needs a gradient; ``lora_modules_to_save`` 'embed' makes block 0 whole), and of the head;
      weight-gradient GEMMs of the adapters (2*t*r*(in + out) each) and of the head when it is saved.
    - ``frozen``: nothing below block ``frozen_layers``; from there up input- and weight-gradient GEMMs of every
      matmul (its norms train, so its first projections pass the gradient to them), and the head's (a head tied
      to the frozen embedding is frozen with it: no weight gradient).

    For the fine-tuning methods ``recompute='full'`` is transformers' gradient checkpointing, as the recipes run it:
    ``gradient_checkpointing_enable`` also calls ``enable_input_require_grads`` (transformers modeling_utils.py; peft's
    ``prepare_model_for_kbit_training`` does the same), so the gradient passes through every block whole, frozen ones
    included (input-gradient GEMMs, no weight gradients), and every block runs its forward again, less the block's
    last matmul when nothing after it saves a tensor (no residual dropout): torch's non-reentrant checkpoint stops
    recomputing at the last saved tensor (``early_stop=True``, torch/utils/checkpoint.py), and a matmul saves its
    inputs before it runs; torch's reentrant checkpoint (``setup.checkpoint_reentrant``: peft's
    ``prepare_model_for_kbit_training`` alone) runs the whole block again, its last matmul included
    (``CheckpointFunction.backward``). ``selective`` recomputes the attention cores of the blocks whose backward runs.
    ``causal`` counts the useful half of the scores (:func:`attention_flops`). A mixture of experts under a
    fine-tuning method is refused (:class:`SetupError`): its routed experts' backward is not modelled here.
    """
    b, s = _bounded("batch", setup.batch), _bounded("seq", setup.seq)
    recompute = _check_recompute(setup.recompute)
    parts = forward_flops_breakdown(config, b, s, causal)
    if setup.finetune == "full":
        forward, core = sum(parts.values()), parts["attention_core"]
        extra = recomputed_flops(config, b, s, recompute, recompute_every=setup.recompute_every, causal=causal) \
            if recompute == "op" or setup.recompute_every > 1 else \
            {"none": 0, "full": forward - parts["head"], "selective": core}[recompute]
        return StepFlops(forward, forward + core, forward - core, extra, b * s)
    if recompute == "op" or setup.recompute_every > 1:
        raise SetupError(f"the FLOPs of finetune={setup.finetune!r} under torchtitan's recompute policies (op, "
                         "recompute_every) are not counted: use recompute none or full (transformers' checkpointing)")
    if config.is_moe:
        raise SetupError(f"finetune={setup.finetune!r} FLOPs of a mixture of experts are not modelled (which "
                         "experts' backward runs depends on the routing): use finetune='full' or a dense model")
    stages = _block_stages(config, b, s, causal)
    if setup.finetune == "frozen":
        adapters, rank, trained = [], 0, config.n_layers - setup.frozen_layers
        if trained < 1:
            raise ConfigError(f"frozen_layers={setup.frozen_layers} freezes every one of the model's "
                              f"{config.n_layers} blocks: leave at least one to train")
        lowest, weights = -1, trained * (sum(stages.values()) - stages["core"])
        weights += 0 if config.tied_embeddings else parts["head"]
    else:
        outer = [k for k in setup.lora_target_kinds if k in ("embed", "head")]
        if outer:
            raise SetupError(f"the FLOPs of LoRA on {' and '.join(outer)} (outside the blocks) are not counted: "
                             "adapt the blocks' Linears, or train the head/embedding with lora_modules_to_save")
        adapters, rank, trained = adapter_shapes(config, setup.lora_target_kinds), setup.lora_r, config.n_layers
        lowest = -1 if "embed" in setup.lora_save_kinds else min(_STAGE_OF[k] for k, _, _ in adapters)
        weights = trained * sum(2 * b * s * rank * (i + o) for _, i, o in adapters)
        weights += parts["head"] if "head" in setup.lora_save_kinds else 0
    return _finetune_step(config, b * s, stages, adapters, rank, parts["head"], weights, trained, lowest, recompute,
                          reentrant=bool(getattr(setup, "checkpoint_reentrant", False)))


def _finetune_step(config: TransformerConfig, t: int, stages: dict[str, int], adapters: list[tuple[str, int, int]],
                   rank: int, head: int, weights: int, trained: int, lowest: int, recompute: str, *,
                   reentrant: bool = False) -> StepFlops:
    """:func:`step_flops` of a fine-tuning method over ``t`` tokens, from one block's ``stages``, its ``adapters``,
    the ``head``'s forward, the ``weights``' gradient GEMMs, the ``trained`` top blocks the gradient passes through
    (in the lowest of them from stage ``lowest`` up) and ``recompute`` (``reentrant``: no early stop)."""
    n_l = config.n_layers
    adapters_fwd = sum(2 * t * rank * (i + o) for _, i, o in adapters)
    block = sum(stages.values()) + adapters_fwd
    if recompute == "full":  # transformers' checkpointing makes the embedding's output require grad: all blocks
        passed, backward = n_l, n_l * _input_grads(stages, adapters, rank, t, -1)
        down = [o for k, _, o in adapters if k == "down"]  # the block's last matmul: down's B, else down itself
        last = 0 if config.dropout or reentrant else (2 * t * rank * down[0] if down else stages["down"])
        again = n_l * (block - last)
    else:
        passed = trained
        backward = (trained - 1) * _input_grads(stages, adapters, rank, t, -1) + _input_grads(
            stages, adapters, rank, t, lowest)
        again = passed * stages["core"] if recompute == "selective" else 0
    return StepFlops(n_l * block + head, backward + head, weights, again, t)


def step_time_to_tokens_per_second(step_time_s: float, batch: int, seq: int, num_devices: int = 1) -> float:
    """Tokens per second of a run: batch * seq * num_devices / step_time_s.

    ``batch`` is sequences per step per data-parallel replica and ``num_devices`` the number of replicas that
    each process a different batch; with one replica (or a global batch) pass ``num_devices=1``.
    """
    t = _pos_num("step_time_s", step_time_s)
    return _bounded("batch", batch) * _bounded("seq", seq) * _bounded("num_devices", num_devices) / t


@dataclass(frozen=True)
class MFUResult:
    """Model (and hardware) FLOPs utilisation of a measured throughput, or "unknown" with the reason.

    MFU = tokens/s * model FLOPs per token / (num_devices * peak); HFU uses the FLOPs executed, recomputation
    included (Korthikanti et al. 2022). FLOP/s figures are totals over all devices.
    """

    mfu: float | None
    hfu: float | None
    achieved_flops_per_s: float
    """tokens/s x model FLOPs per token (useful work, all devices)."""
    model_flops_per_token: float
    hardware_flops_per_token: float | None
    peak_flops_per_s: float | None
    """num_devices x the dense per-device peak; None when unknown."""
    peak_source: str
    dtype: str
    num_devices: int
    reason: str | None
    """Why mfu is None (None when known)."""
    tokens_per_second: float
    recompute: str
    formula: str
    """Which FLOPs-per-token formula was used."""
    accelerator: str | None
    """Key (or name) of the device whose peak was used."""
    verdict: str = "ok"
    """``ok``; ``unknown`` (no peak); or ``implausible``: the ratio came out above 100 % of the peak, which no run
    can reach, so ``mfu``/``hfu`` are None and ``reason`` names the likely mistake."""
    computed_mfu: float | None = None
    """tokens/s x FLOPs per token / peak as computed, before the plausibility check (above 1 when implausible)."""

    @property
    def known(self) -> bool:
        """Whether a plausible MFU could be computed (the peak is known and the ratio is at most 1)."""
        return self.mfu is not None

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready), with ``known``."""
        return {**asdict(self), "known": self.known}


def _finetune_per_token(model: TransformerConfig | float | None, seq: int | None, recompute: str,
                        finetune: Setup) -> tuple[float, float, str]:
    """:func:`_per_token` of a fine-tuning step (``finetune.finetune`` lora, qlora or frozen): :func:`step_flops`
    of one sequence over its tokens, attention counted non-causal as PaLM counts it."""
    if not isinstance(model, TransformerConfig):
        raise SetupError(f"finetune={finetune.finetune!r} FLOPs need the model's shapes (which weights train, the "
                         "adapters' sizes): give a model config (--hf, --model, --preset or dimensions), not a bare "
                         "parameter count")
    if seq is None:
        raise SetupError("seq is required with a model config: the attention term depends on the training sequence "
                         "length")
    s = check_int("seq", seq, hi=LIMITS["seq"].max, why=LIMITS["seq"].why, err=SetupError)
    model.check_seq(s)
    step = step_flops(model, finetune.with_(batch=1, seq=s, recompute=recompute))
    what = (f"LoRA r={finetune.lora_r} on {','.join(finetune.lora_target_kinds)}" if finetune.finetune != "frozen"
            else f"bottom {finetune.frozen_layers} blocks frozen")
    formula = (f"{finetune.finetune} ({what}): the step's matmuls per token, T = {s} (forward, input-gradient GEMMs "
               "of the blocks the gradient passes, weight-gradient GEMMs of trainable weights only; model FLOPs "
               "without recompute, PaLM Appendix B)")
    return step.model / s, step.hardware / s, formula


def _per_token(model: TransformerConfig | float | None, seq: int | None, recompute: str,
               override: float | None, finetune: Setup | None = None,
               recompute_every: int = 1) -> tuple[float, float | None, str]:
    """(model FLOPs/token, hardware FLOPs/token or None, formula description)."""
    if finetune is not None and finetune.finetune != "full":
        if override is not None:
            raise SetupError("model_flops_per_token overrides the count: leave finetune out with it")
        if recompute_every > 1:
            raise SetupError(f"the FLOPs of finetune={finetune.finetune!r} under torchtitan's recompute policies (op, "
                             "recompute_every) are not counted: use recompute none or full (transformers' "
                             "checkpointing)")
        return _finetune_per_token(model, seq, recompute, finetune)
    if recompute_every > 1 and recompute != "full":
        raise SetupError(f"recompute_every={recompute_every} checkpoints every k-th block: it goes with "
                         "recompute='full'")
    if override is not None:
        value = check_number("model_flops_per_token", override, lo=0.0, lo_open=True, hi=6 * LIMITS["params"].max,
                             why="6 x the largest parameter count memlab accepts", err=ConfigError)
        return value, value if recompute == "none" else None, "given model_flops_per_token"
    if isinstance(model, TransformerConfig):
        if seq is None:
            raise SetupError("seq is required with a model config: the attention term 12*L*h*seq depends on the "
                             "training sequence length (pass the length actually trained on, not max_seq)")
        s = check_int("seq", seq, hi=LIMITS["seq"].max, why=LIMITS["seq"].why, err=SetupError)
        model.check_seq(s)
        hw = megatron_iteration_flops(model, 1, s, recompute, recompute_every=recompute_every) / s
        return flops_per_token(model, s), hw, f"PaLM 6N + 12*L*H*Q*T, N = matmul weights, T = {s}"
    if isinstance(model, int | float) and not isinstance(model, bool):
        n = check_number("parameter count", model, lo=0.0, lo_open=True, hi=LIMITS["params"].max,
                         why=LIMITS["params"].why, err=ConfigError)
        hw = {"none": 6 * n, "full": 8 * n}.get(recompute) if recompute_every == 1 else None
        return 6 * n, hw, "6N from a bare parameter count (attention FLOPs excluded; HFU unknown for selective, op)"
    raise ConfigError(f"model must be a TransformerConfig or a parameter count, got {type(model).__name__}")


def mfu(model: TransformerConfig | float | None, tokens_per_second: float, *,
        accelerator: Accelerator | DeviceInfo | str | None, num_devices: int = 1, dtype: str = "bf16",
        seq: int | None = None, recompute: Recompute = "none",
        model_flops_per_token: float | None = None, finetune: Setup | None = None,
        recompute_every: int = 1) -> MFUResult:
    """MFU (and HFU) of a measured throughput: tokens/s * model FLOPs per token / (num_devices * dense peak).

    ``model``: a :class:`TransformerConfig` (FLOPs/token by :func:`flops_per_token`, needs ``seq``) or a bare
    parameter count N (FLOPs/token = 6N, attention excluded). ``model_flops_per_token`` overrides both (for
    published models a config cannot express, e.g. PaLM's head_dim != d_model / n_heads). ``accelerator``: a
    table row, a key for :func:`memlab.predict.hardware.gpus.gpu`, a :class:`DeviceInfo` from ``detect()``, or None.
    When the peak for ``dtype`` is unknown, ``mfu`` and ``hfu`` are None and ``reason`` says why: no other device's
    peak is ever borrowed. ``num_devices`` counts devices as PyTorch sees them (an MI250X package is 2).
    ``finetune``: a :class:`~memlab.predict.spec.setup.Setup` whose fine-tuning fields (``finetune``, ``lora_rank``,
    ``lora_targets``, ``lora_modules_to_save``, ``frozen_layers``) describe the step; its batch, seq and recompute
    are replaced by this call's. Under lora, qlora or frozen the FLOPs per token are :func:`step_flops` of the step
    over its tokens: model FLOPs are the work the step needs (no weight-gradient GEMMs of frozen weights, no
    recompute: PaLM Appendix B's MFU [chowdhery2022]), hardware FLOPs add the recompute. ``recompute_every`` k
    (with ``recompute='full'``): torchtitan's layer policy, every k-th block recomputed (:func:`recomputed_flops`).
    """
    tps = check_number("tokens_per_second", tokens_per_second, lo=0.0, lo_open=True, hi=LIMITS["tokens_per_s"].max,
                       why=LIMITS["tokens_per_s"].why, err=SetupError)
    n_dev = check_int("num_devices", num_devices, hi=LIMITS["devices"].max, why=LIMITS["devices"].why, err=SetupError)
    dtype = canonical_choice(dtype, PEAK_DTYPES)
    if dtype not in PEAK_DTYPES:
        raise unknown_name("dtype", str(dtype), PEAK_DTYPES)
    recompute = _check_recompute(recompute)
    if finetune is not None and not isinstance(finetune, Setup):
        raise SetupError(f"finetune must be a memlab Setup (Setup(finetune='lora', lora_rank=16)) or None, got "
                         f"{type(finetune).__name__}")
    every = check_int("recompute_every", recompute_every, hi=LIMITS["layers"].max, why=LIMITS["layers"].why,
                      err=SetupError)
    model_fpt, hw_fpt, formula = _per_token(model, seq, recompute, model_flops_per_token, finetune, every)

    label: str | None = None
    if isinstance(accelerator, str):
        accelerator = gpu(accelerator)
    if isinstance(accelerator, Accelerator):
        peak, source, label = accelerator.peak(dtype), accelerator.peak_source, accelerator.key
        why = f"unknown peak: {accelerator.name} has no published dense {dtype} peak ({accelerator.notes})"
    elif isinstance(accelerator, DeviceInfo):
        peak, source, label = accelerator.peak_flops[dtype], accelerator.peak_source, accelerator.name
        why = f"unknown peak: {accelerator.peak_reason or f'no {dtype} peak for {accelerator.name}'}"
    elif accelerator is None:
        peak, source, why = None, "unknown", "unknown peak: no accelerator given"
    else:
        raise SetupError(f"accelerator must be an Accelerator, DeviceInfo, GPU name or None, got "
                         f"{type(accelerator).__name__}")

    achieved = tps * model_fpt
    if peak is None:
        return MFUResult(None, None, achieved, model_fpt, hw_fpt, None, source if source != "unknown" else "unknown",
                         dtype, n_dev, why, tps, recompute, formula, label, "unknown", None)
    total_peak = n_dev * peak
    ratio = achieved / total_peak
    hfu = tps * hw_fpt / total_peak if hw_fpt is not None else None
    if ratio > 1 or (hfu is not None and hfu > 1):
        return MFUResult(None, None, achieved, model_fpt, hw_fpt, total_peak, source, dtype, n_dev,
                         implausible_reason(ratio, hfu, dtype, n_dev), tps, recompute, formula, label, "implausible",
                         ratio)
    return MFUResult(ratio, hfu, achieved, model_fpt, hw_fpt, total_peak, source, dtype, n_dev,
                     None, tps, recompute, formula, label, "ok", ratio)


def implausible_reason(mfu: float, hfu: float | None, dtype: str, num_devices: int) -> str:
    """Why an MFU (or HFU) above 1 cannot be right, with the usual mistakes that produce one."""
    which = f"MFU {100 * mfu:,.4g} %" if mfu > 1 else f"HFU {100 * (hfu or 0):,.4g} %"
    return (f"implausible: {which} of the dense {dtype} peak of {num_devices} device(s), and no run exceeds its "
            "peak. Check: the throughput counts more devices than num_devices; a per-device batch was multiplied "
            "by GPUs that share it (tensor/pipeline parallel: use the global batch); the peak is a sparse or "
            "another dtype's figure; the FLOPs per token are too high (wrong seq, model or recompute)")


def roofline_bound(intensity_flop_per_byte: float | Any, peak_flop_per_s: float,
                   bandwidth_bytes_per_s: float) -> float | Any:
    """The roofline's attainable FLOP/s: ``min(peak, intensity × bandwidth)`` [williams2009].

    ``intensity_flop_per_byte`` is FLOPs per byte of memory traffic (a number or a numpy/pandas array, kept
    element-wise); ``peak_flop_per_s`` the compute roof and ``bandwidth_bytes_per_s`` the memory roof, both
    positive. A kernel below the ridge point ``peak / bandwidth`` is memory-bound.
    """
    import numpy as np

    for name, v in (("peak_flop_per_s", peak_flop_per_s), ("bandwidth_bytes_per_s", bandwidth_bytes_per_s)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise SetupError(f"{name} must be a positive finite number, got {v!r}")
    try:
        intensity = np.asarray(intensity_flop_per_byte, dtype=float)
    except (TypeError, ValueError):
        raise SetupError(f"intensity_flop_per_byte must be a number or an array of numbers (FLOP per byte), got "
                         f"{type(intensity_flop_per_byte).__name__}") from None
    if isinstance(intensity_flop_per_byte, bool | str) or not np.all(np.isfinite(intensity)) or np.any(intensity < 0):
        raise SetupError("intensity_flop_per_byte must be finite and >= 0 (FLOP per byte of traffic); got NaN, "
                         "infinity, a negative value or a non-number")
    out = np.minimum(peak_flop_per_s, intensity * bandwidth_bytes_per_s)
    return float(out) if np.ndim(out) == 0 else out
