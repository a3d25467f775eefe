"""What the newer families' code adds to the saved tensors and what it cannot run, kept beside
:mod:`memlab.predict.memory.activations` (which calls these): the q/k norms' rows (Qwen3, OLMo 2, Gemma 3), a grouped
mixture of experts' router and routed-pair rows (Mixtral, Qwen3-MoE, Qwen2-MoE) and its shared expert's
(Qwen2-MoE), and the setup
refusals of a sliding window and of soft-capping (:mod:`memlab.predict.families` sets the traits). Pure
arithmetic on ints or numpy arrays; no torch.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig

FP32 = 4


def qk_norm_rows(config: TransformerConfig, t: Any, compute: float) -> list[tuple]:
    """What the RMSNorms on q and k keep (``config.impl.qk_norm``), all layers, as activation term rows: the
    projection's output upcast to fp32 (in an fp32 model the output itself, otherwise a new fp32 tensor), the fp32
    rstd per normalised row, and the normalised tensor the weight multiplies (cast back to the projection's dtype,
    ``compute`` bytes, or fp32 for OLMo 2's and Gemma's kinds, Gemma's with ``1 + weight``) [hf-transformers:
    modeling_qwen3.py Qwen3RMSNorm, modeling_olmo2.py Olmo2RMSNorm, modeling_gemma3.py Gemma3RMSNorm]. ``t``:
    tokens in the micro-batch."""
    im, L = config.impl, config.n_layers
    width = config.q_dim + config.kv_dim
    rows = (config.n_heads + config.n_kv_heads) if im.qk_norm == "head" else 2
    weight = 2 * config.head_dim if im.qk_norm == "head" else width
    out: list[tuple] = [("q/k norm input, fp32", "norms", L * t * width, FP32, True, "x.to(float32)"),
                        ("q/k norm rstd, fp32", "norms", L * t * rows, FP32, True)]
    if im.rmsnorm in ("fp32", "fp32-product"):
        out.append(("q/k norm x*rstd, fp32", "norms", L * t * width, FP32, True))
        if im.rmsnorm == "fp32":
            out.append(("q/k norm 1 + weight, fp32", "norms", L * weight, FP32, False))
    else:
        out.append(("q/k norm x*rstd cast back", "norms", L * t * width, compute, True))
    return out


INT64, INT32 = 8, 4


def grouped_expert_rows(config: TransformerConfig, t: Any, w: dict[str, float], n_f: int,
                        cuda_autocast: bool = False, autocast: bool = False) -> list[tuple]:
    """What a transformers 5 sparse MoE block keeps besides its input (``config.impl.grouped_experts``, Mixtral),
    all layers, as activation term rows. The router keeps its fp32 softmax (t, E), top-k's int64 indices (t, k),
    and for the renormalisation the fp32 top-k values and their sum; the experts, run by ``grouped_mm`` on the
    S = t k (token, choice) pairs sorted by expert, keep three int64 index tensors of S (the gather of the inputs,
    of the routing weights, and the inverse permutation), the int32 offsets (E), the gathered inputs (S, h), the
    d_ff-wide tensors of one gated MLP per pair (``impl.mlp_saved_tensors`` of one gate_up tensor, chunked; ``n_f``: a
    dense or shared MLP's, separate gate and up), the fp32 routing weights
    (S, 1) and the down projection's output (S, h). Every size is set by t, k and E alone, whatever the routing
    (measured with different seeds and inputs, tests/run/test_hf.py) [hf-transformers: modeling_mixtral.py
    MixtralTopKRouter.forward; integrations/moe.py grouped_mm_experts_forward]. ``t``: tokens in the micro-batch;
    ``w``: :func:`memlab.predict.memory.activations.widths`; the experts' tensors are in the model's dtype
    (``residual``: CPU autocast has no rule for ``grouped_mm``, measured), the routing weights fp32 or
    (``impl.moe_weights_fp32``
    False, Qwen3-MoE) the router's ``compute`` dtype, the renormalisation's rows only with ``impl.moe_topk_renorm``;
    under CUDA autocast (``cuda_autocast``), not measured, a :class:`~memlab.errors.SetupError`; a shared expert's
    rows (:func:`shared_expert_rows`, ``autocast``: the step runs under autocast) and those of dense layers among
    the MoE ones (:func:`dense_layer_rows`) come first; the MoE rows count the MoE layers only
    (``config.moe_layers``)."""
    if cuda_autocast:
        raise SetupError(f"{config.impl.family}: grouped_mm experts under CUDA autocast are not measured (whether "
                         "autocast casts them is not modelled); use a bf16 or fp32 model, or CPU")
    L, E, k, h, f, im = config.moe_layers, config.n_experts, config.top_k, config.d_model, config.ffn, config.impl
    pairs, width = t * k, w["residual"]
    n_e = im.mlp_saved_tensors(config.mlp, gate_up_one_tensor=True)  # the experts' gate_up is one tensor, chunked
    unaligned = [f"{name} {n} x {width:g} B" for name, n in (("hidden size", h), ("expert width", f))
                 if (n * width) % 16]
    if unaligned:  # torch's grouped_mm kernels (CPU and CUDA) check every row stride: a real step raises
        raise SetupError(f"{im.family}: grouped_mm needs every row of its experts' inputs a multiple of 16 bytes, and "
                         f"{', '.join(unaligned)} is not, so the real step fails ('strides should be multiple of 16 "
                         "bytes', measured on CPU): choose sizes whose rows are whole 16-byte units")
    return [*dense_layer_rows(config, t, w, n_f, autocast), *shared_expert_rows(config, t, w, n_f, autocast),
            ("MoE router softmax, fp32", "mlp", L * t * E, FP32, False),
            ("MoE top-k indices", "mlp", L * pairs, INT64, False),
            ("MoE top-k weights and their sum, fp32", "mlp", L * (pairs + t) if im.moe_topk_renorm else 0, FP32,
             False),
            ("MoE sort and gather indices (3 per layer)", "mlp", 3 * L * pairs, INT64, False),
            ("MoE grouped_mm offsets", "mlp", L * E, INT32, False),
            ("MoE gathered expert inputs", "mlp", L * pairs * h, width, False),
            (f"MoE expert MLP tensors (d_ff wide, {n_e} per pair)", "mlp", n_e * L * pairs * f, width, True),
            ("MoE routing weights per pair", "mlp", L * pairs, FP32 if im.moe_weights_fp32 else w["compute"], False),
            ("MoE expert outputs", "mlp", L * pairs * h, width, False)]


def dense_layer_rows(config: TransformerConfig, t: Any, w: dict[str, float], n_f: int,
                     autocast: bool = False) -> list[tuple]:
    """What the dense layers among a grouped mixture of experts' layers keep in their MLP (``impl.dense_layers``,
    ``impl.dense_ff`` wide; none without them), as activation term rows: the ``n_f`` d_ff-wide tensors of one gated
    MLP per token, as a dense model's, and under autocast one more 16-bit copy of the MLP input (the gate and up
    projections cast it each; the MLP input row counts one) [hf-transformers: modeling_qwen2_moe.py Qwen2MoeMLP].
    Measured on CPU (tests/run/test_moe_hf.py)."""
    n = len(config.impl.dense_layers)
    if not n:
        return []
    rows = [(f"dense layers' MLP tensors ({n_f} per token, dense_ff wide)", "mlp",
             n_f * n * t * config.impl.dense_ff, w["compute"], True)]
    if autocast:
        rows.append(("dense layers' second 16-bit copy of the MLP input", "mlp", n * t * config.d_model,
                     w["compute"], False))
    return rows


def shared_expert_rows(config: TransformerConfig, t: Any, w: dict[str, float], n_f: int,
                       autocast: bool = False) -> list[tuple]:
    """What a gated shared expert keeps (``config.impl.shared_expert_ff`` wide; none without one), all layers, as
    activation term rows: the ``n_f`` d_ff-wide tensors of one gated MLP per token (as a dense layer's), its down
    projection's output (t, h), which the gate multiplies, and the gate's sigmoid output (t, 1), all in the compute
    dtype [hf-transformers: modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.forward:
    ``F.sigmoid(self.shared_expert_gate(x)) * shared_expert_output``]; under autocast (``autocast``) also the
    16-bit copies of the block's input that its gate, up and gate-logit projections each cast (the router's is the
    MLP input row). Measured on CPU (tests/run/test_moe_hf.py). ``t``: tokens in the micro-batch; ``w``:
    :func:`memlab.predict.memory.activations.widths`."""
    sf, L, h = config.impl.shared_expert_ff, config.moe_layers, config.d_model
    if not sf:
        return []
    casts = [("MoE shared expert inputs cast to 16 bits (gate, up, gate logit)", "mlp", 3 * L * t * h,
              w["compute"], False)] if autocast else []
    return [*casts, (f"MoE shared expert MLP tensors ({n_f} per token)", "mlp", n_f * L * t * sf, w["compute"], True),
            ("MoE shared expert output (the gate multiplies it)", "mlp", L * t * h, w["compute"], False),
            ("MoE shared expert gate sigmoid", "mlp", L * t, w["compute"], False)]


def check_family_setup(config: TransformerConfig, setup: Any, seq: Any = None) -> None:
    """Raise :class:`~memlab.errors.SetupError` (one line) for a setup the family's code runs differently from what
    memlab counts: a ``seq`` (default ``setup.seq``) reaching the sliding window with a fused or math kernel
    (:meth:`~memlab.predict.spec.traits.Implementation.check_window`); attention soft-capping with SDPA's math or
    memory-efficient kernel (PyTorch SDPA has no softcap; transformers refuses sdpa for Gemma 2); the final logits'
    soft-capping with memlab's chunked or fused loss (which compute the logits themselves, without the cap); LoRA
    or QLoRA on a grouped mixture of experts (``impl.grouped_experts``: measured not to match, not modelled)."""
    im = config.impl
    im.check_window(setup.seq if seq is None else seq, setup.attention)
    if im.family == "reference" and getattr(setup, "loss_call", "labels") != "labels":
        raise SetupError("loss_call='manual' describes a transformers model's call; memlab's own GPT computes its "
                         "loss itself (memlab.model.loss.logits_loss, upcast to fp32): leave loss_call='labels'")
    if im.grouped_experts and setup.finetune in ("lora", "qlora"):  # measured off by a d_ff-wide tensor per pair
        raise SetupError(f"{im.family}: LoRA and QLoRA around grouped_mm experts are not modelled (a frozen "
                         "expert keeps other tensors than a trained one); use full training or frozen layers")
    if im.attn_softcap and setup.attention in ("math", "efficient"):
        raise SetupError(f"{im.family}: attention logit soft-capping runs in eager or flash attention only "
                         "(PyTorch SDPA has no softcap; transformers refuses sdpa for it)")
    if im.final_softcap and setup.mode != "inference" and setup.loss != "plain":
        raise SetupError(f"{im.family}: final_logit_softcapping caps the model's own logits; the {setup.loss} loss "
                         "computes its logits itself, without the cap: use loss='plain'")
    _check_autocast_draws(config, setup)


def _check_autocast_draws(config: TransformerConfig, setup: Any) -> None:
    """Refuse the two HF setups under bf16 autocast that generated draws (:mod:`memlab.studies.hf_draws`) found
    memlab's count to miss, each measured on tiny configs and not yet modelled: eager attention with dropout on the
    probabilities in a family that softmaxes in fp32 (one more 16-bit (b, a, s, s) tensor per layer: Llama, Qwen2,
    Phi, Starcoder2); Falcon with ``bias`` (-512 B per token and layer at d_model 64). (Eager attention with one K/V
    head at batch 1 is modelled: :func:`rotated_k_is_fp32`.)"""
    im = config.impl
    if im.family == "reference" or not setup.policy.autocast or setup.mode == "inference":
        return
    why = ""
    if setup.attention == "eager" and im.softmax_fp32 and im.attention_dropout_or(config.dropout) > 0:
        why = "eager attention with attention dropout keeps one more 16-bit score tensor per layer than memlab counts"
    elif im.family == "falcon" and im.mlp_bias is not False:  # None: as config.bias (True: the norms' bias)
        why = "Falcon with bias keeps per-token tensors memlab does not count"
    if why:
        raise SetupError(f"{im.family} under bf16 autocast: {why} (measured on tiny configs, not modelled yet): "
                         "use a 16-bit or fp32 model without autocast, or trace it (memlab trace --hf)")


def rotated_k_is_fp32(config: TransformerConfig, setup: Any) -> bool:
    """Whether the rotated k is fp32 in a 16-bit attention, so that the kernel's autocast cast of a K repeated by
    ``repeat_kv`` is a query-width 16-bit copy, kept for backward, even where ``repeat_kv`` left a view (one K/V head
    at batch 1 in eager attention, one K/V head under a padded batch's SDPA): under autocast the per-forward cos and
    sin are in the fp32 model's dtype, so the rotation promotes k to fp32 (a partial rotary's ``torch.cat`` of the
    fp32 rotated part and the 16-bit rest too); v, 16-bit from its projection, is not cast and stays a view. OLMo 2's
    rotation casts q and k back (``rotary_tables_fp32``), so its k stays 16-bit [hf-transformers: modeling_llama.py
    apply_rotary_pos_emb, repeat_kv; modeling_phi.py PhiAttention.forward; modeling_olmo2.py apply_rotary_pos_emb].
    Measured on CPU on every tiny config with one K/V head (``L t (q_dim - head_dim)`` 16-bit elements more than a
    view; tests/predict/memory/test_attention_variants.py, tests/run/test_calls.py)."""
    im = config.impl
    return bool(setup.policy.autocast and config.positions == "rotary" and im.rotary_tables_per_forward
                and not im.rotary_tables_fp32)


def padded_sdpa_rows(config: TransformerConfig, setup: Any, b: Any, s: Any, compute: float) -> list[tuple]:
    """What a padded batch (``Setup.attention_mask='padded'``) adds under CPU SDPA's flash kernel, all layers,
    as activation term rows: transformers then hands SDPA an explicit (b, 1, s, s) mask, which each layer's kernel
    keeps in the compute dtype (unless the family passes one on every call, Falcon: ``impl.sdpa_keeps_mask``, whose
    calls all take the repeats below), and no
    longer uses ``enable_gqa``, so a GQA model's K and V are repeated to the query width first (a copy, unless one
    K/V head: a view) [hf-transformers: integrations/sdpa_attention.py use_gqa_in_sdpa, repeat_kv;
    masking_utils.py sdpa_mask]; with one K/V head under autocast the rotated fp32 k is cast, repeated, to the
    query width (:func:`rotated_k_is_fp32`). Left padding keeps the same. Measured on CPU on every tiny config,
    fp32, bf16 and fp32 under bf16 autocast (benchmarks/call_conventions.py). ``compute``: bytes per element."""
    im = config.impl
    present = True if im.sdpa_keeps_mask else padding_present(setup, b, s)  # Falcon: a mask on every call
    if setup.attention != "flash" or present is False:
        return []
    L, t = config.n_layers, b * s * present
    out: list[tuple] = []
    if not im.sdpa_keeps_mask:
        out.append(("4-D padding mask each layer's SDPA keeps", "attention", L * t * s, compute, False))
    kv = config.q_dim if im.kv_broadcast and config.kv_dim != config.head_dim else config.kv_dim
    if kv not in (config.q_dim, config.head_dim):  # one K/V head: repeat_kv's reshape stays a view of K, V
        out.append(("k, v repeated to the query width (no enable_gqa with a mask)", "attention",
                    L * t * 2 * (config.q_dim - kv), compute, True))
    elif kv != config.q_dim and rotated_k_is_fp32(config, setup):
        # one K/V head under autocast: the rotated k is fp32 (the fp32 cos/sin promote it), and SDPA's cast of its
        # repeated view is a full query-width 16-bit copy; v, already 16-bit, stays a view (measured: Gemma; not
        # OLMo 2, whose rotation casts k back)
        out.append(("k repeated to the query width by autocast's cast (one K/V head)", "attention",
                    L * t * (config.q_dim - kv), compute, True))
    return out


def padding_present(setup: Any, b: Any, s: Any) -> Any:
    """Whether a ``b`` x ``s`` batch of ``setup``'s call has a padding token: ``attention_mask='padded'`` and
    ``floor(pad_fraction b s) >= 1`` (:func:`memlab.model.hf.pad_counts`; elementwise on arrays). A padded call
    that pads no token is the all-ones call, whose mask transformers drops for SDPA (masking_utils.py
    _ignore_causal_mask_sdpa: no padding, no mask): found by the draws, a 1 x 9 batch at pad_fraction 0.1."""
    if getattr(setup, "attention_mask", "none") != "padded":
        return False
    return setup.pad_fraction * b * s >= 1


def check_call(setup: Any, device_type: str) -> None:
    """Raise :class:`~memlab.errors.SetupError` (one line) for a padded batch under SDPA on CUDA. Without a mask (or
    with an all-ones one, which transformers drops for SDPA: masking_utils.py sdpa_mask, _ignore_causal_mask_sdpa)
    SDPA runs ``is_causal`` and PyTorch picks flash for 16-bit inputs and the memory-efficient kernel for fp32
    (:func:`memlab.predict.families.reader.hf_attention`); a padded batch hands it an explicit ``attn_mask``, which the
    CUDA flash kernel does not accept, so PyTorch falls back to the memory-efficient kernel (which takes an additive
    mask and
    keeps it for backward) or the math one [pytorch-sdpa: torch.nn.functional.scaled_dot_product_attention,
    torch.nn.attention.sdpa_kernel: the CUDA flash backend takes no attn_mask]: which kernel and what it keeps are not
    measured (no GPU run yet; tests/run/test_calls.py, marked gpu), so it is refused rather than guessed."""
    if setup.mode == "train" and padding_present(setup, setup.batch, setup.seq) and setup.attention != "eager" \
            and device_type != "cpu":
        raise SetupError(f"attention_mask='padded' with attention={setup.attention!r} on {device_type} is not "
                         "measured (CUDA SDPA's flash kernel takes no explicit mask; the memory-efficient or math "
                         "kernel it falls back to keeps other tensors): use attention='eager', or device cpu")


def manual_loss(setup: Any) -> bool:
    """Whether the loss is the hand-written one on the returned logits (``Setup.loss_call='manual'``) in a 16-bit
    model without autocast, the one case where it differs from transformers' loss: no fp32 upcast of the logits
    (:func:`memlab.model.loss.logits_loss` with ``upcast=False``). In fp32 the upcast is a no-op, and under
    autocast cross_entropy runs in fp32 on CPU and on CUDA alike (both autocast op lists name it [pytorch-amp]), so
    both calls keep the same there (measured on CPU, benchmarks/call_conventions.py --loss-call)."""
    return getattr(setup, "loss_call", "labels") == "manual" and not setup.policy.autocast \
        and setup.policy.compute_dtype != "fp32"


def log_softmax_bytes(setup: Any, compute: float) -> float:
    """Bytes per element of the plain loss's kept log-softmax (and of its ``total_weight`` scalar): fp32, or the
    logits' ``compute`` bytes for the hand-written loss in a 16-bit model (:func:`manual_loss`)."""
    return compute if manual_loss(setup) else FP32


def loss_call_transients(setup: Any, fwd: float, bwd: float) -> tuple[float, float]:
    """Bytes per logit alive at the end of forward and at the start of backward for the plain loss: ``fwd`` and
    ``bwd`` (transformers' loss: the 16-bit logits and their fp32 copy, then the fp32 gradients of the log-softmax
    and of the logits), or 2 and 4 for the hand-written loss in a 16-bit model (:func:`manual_loss`: the 16-bit
    logits alone, then their 16-bit gradients)."""
    return (2.0, 4.0) if manual_loss(setup) else (fwd, bwd)


def checkpoint_mask_rows(config: TransformerConfig, setup: Any, b: Any, s: Any, residual: float) -> list[tuple]:
    """What full recompute (transformers' gradient checkpointing, non-reentrant) keeps of the attention mask: a
    checkpointed layer saves its positional arguments and holds its keyword arguments by reference
    [hf-transformers: modeling_layers.py GradientCheckpointingLayer.__call__, partial(super().__call__, **kwargs)],
    so only a family that hands the mask positionally (``impl.checkpoint_keeps_mask``: GPT-2's block) keeps it,
    once (every layer gets the same tensor): eager's (b, 1, s, s) causal mask in the ``residual`` dtype (bytes per
    element), or under SDPA a padded batch's (b, 1, s, s) bool mask (without padding SDPA gets no mask). The
    rotary cos/sin and position ids go by keyword in every family: not kept. Measured on CPU on every tiny HF
    config with no mask, an all-ones mask and a padded batch (benchmarks/call_conventions.py)."""
    if not config.impl.checkpoint_keeps_mask:
        return []
    if setup.attention == "eager":
        return [("4-D attention mask, checkpoint input", "block inputs (recompute)", b * s * s, residual, False)]
    present = padding_present(setup, b, s)
    if present is not False:
        return [("4-D bool padding mask, checkpoint input", "block inputs (recompute)", b * s * s * present, 1,
                 False)]
    return []


def cuda_autocast_gelu_note(config: TransformerConfig, setup: Any, device_type: str) -> str | None:
    """The assumption for a composed tanh GELU (``gelu_new``: GPT-2, GPT-J, Phi; hf-transformers activations.py
    NewGELUActivation, ``torch.pow(input, 3.0)``) under CUDA autocast, None elsewhere: CUDA's autocast runs ``pow``
    in fp32 while CPU's op lists have no rule for it [pytorch-amp: Autocast Op Reference, "CUDA Ops that can
    autocast to float32" vs the CPU lists], so on CUDA part of the GELU's chain runs in fp32. Its d_ff-wide tensors
    are counted in 16 bits as measured on CPU; not measured on CUDA, the error is named with its bound: at most all
    of them twice as wide, ``2 x n_f x L x d_ff`` bytes per token."""
    im = config.impl
    if device_type != "cuda" or not setup.policy.autocast or setup.mode != "train" or im.act(config.mlp) != "gelu_new":
        return None
    per_token = 2 * im.mlp_saved_tensors(config.mlp) * config.n_layers * config.ffn
    return (f"{im.family}'s gelu_new under CUDA autocast: its {im.mlp_saved_tensors(config.mlp)} d_ff-wide tensors "
            "per layer are counted in 16 bits as measured on CPU; CUDA's autocast runs the torch.pow inside it in fp32 "
            "(CPU's does not; torch Autocast Op Reference), not measured on CUDA: up to "
            f"{per_token:,} B per token more ({per_token / 2**10:.1f} KiB) if all of them were fp32")
