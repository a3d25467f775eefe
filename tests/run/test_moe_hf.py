"""Mixtral, Qwen3-MoE and Qwen2-MoE (transformers 5: 3-D experts, an fp32 router softmax, grouped_mm on the (token,
choice) pairs; Qwen2-MoE's gated shared expert) in one real CPU training step: the saved-for-backward bytes equal
memlab's term-by-term count whatever the routing (other seeds, other inputs, generated expert counts and top-k),
model states equal the estimator's, and what memlab does not model is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from memlab.errors import ConfigError, SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.activations import activation_bytes
from memlab.predict.spec.setup import Setup
from memlab.run.hf import predict_hf, run_hf

_DIR = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny"
TINY, QWEN3_MOE, QWEN2_MOE = ({k: v for k, v in json.loads((_DIR / f"{f}.json").read_text()).items()
                               if not k.startswith("_")} for f in ("mixtral", "qwen3_moe", "qwen2_moe"))


def _generated(n: int) -> list[tuple[dict, str, str, int, int]]:
    """Random small Mixtral layouts and runs: experts, top-k, widths, heads, attention, dtype, batch, seq."""
    rng = random.Random("mixtral")
    out = []
    for _ in range(n):
        experts = rng.randint(2, 6)
        heads = rng.choice([2, 4])
        cfg = {**TINY, "num_local_experts": experts, "num_experts_per_tok": rng.randint(1, experts),
               "hidden_size": heads * rng.choice([8, 16]), "num_attention_heads": heads,
               "num_key_value_heads": rng.choice([1, heads]), "intermediate_size": rng.choice([24, 48, 80]),
               "num_hidden_layers": rng.randint(1, 2)}
        out.append((cfg, rng.choice(["eager", "sdpa"]), rng.choice(["fp32", "bf16"]), rng.randint(1, 3),
                    rng.randint(5, 33)))
    return out


@pytest.mark.parametrize(("cfg", "attn", "dtype", "batch", "seq"), _generated(8))
def test_saved_bytes_are_exact_and_do_not_depend_on_the_routing(cfg: dict, attn: str, dtype: str, batch: int,
                                                                 seq: int) -> None:
    """Two seeds: other weights and other tokens, so other experts chosen; the bytes are the same and predicted."""
    runs = [run_hf(cfg, attn_implementation=attn, dtype=dtype, batch=batch, seq=seq, seed=seed) for seed in (0, 7)]
    config = runs[0][0]
    assert runs[0][1].saved_bytes == runs[1][1].saved_bytes
    for _, m in runs:
        p = predict_hf(config, m)
        assert p["activations"] == m.saved_bytes
        assert (p["params"], p["grads"], p["optimizer"]) == (m.params_bytes, m.grads_bytes, m.optimizer_bytes)
    assert config.param_count() == runs[0][1].params


def test_the_two_seeds_route_tokens_differently() -> None:
    """The seeds above do change tokens per expert (else the routing-independence check would prove nothing)."""
    import torch

    from memlab.model.hf import build_hf_model
    from memlab.model.step import token_ids

    counts = []
    for seed in (0, 7):
        model = build_hf_model(TINY, seed=seed)
        seen: list[torch.Tensor] = []
        model.model.layers[0].mlp.gate.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(out[2]))
        with torch.no_grad():
            model(input_ids=token_ids(TINY["vocab_size"], 2, 24, torch.device("cpu"), seed))
        counts.append(torch.bincount(seen[0].flatten(), minlength=TINY["num_local_experts"]).tolist())
    assert counts[0] != counts[1] and sum(counts[0]) == sum(counts[1]) == 2 * 24 * TINY["num_experts_per_tok"]


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_qwen3_moe_with_and_without_renormalised_weights_is_exact(norm: bool, dtype: str) -> None:
    """Qwen3-MoE's router renormalises only with norm_topk_prob, and casts the weights to its logits' dtype."""
    cfg = {**QWEN3_MOE, "norm_topk_prob": norm}
    config, m = run_hf(cfg, attn_implementation="sdpa", dtype=dtype, batch=2, seq=19, seed=3)
    assert config.impl.moe_topk_renorm is norm and not config.impl.moe_weights_fp32
    p = predict_hf(config, m)
    assert p["activations"] == m.saved_bytes
    assert (p["params"], p["grads"], p["optimizer"]) == (m.params_bytes, m.grads_bytes, m.optimizer_bytes)


def _qwen2_moe_generated(n: int) -> list[tuple[dict, str, str, bool, int, int]]:
    """Random small Qwen2-MoE layouts and runs: experts, top-k, renormalisation, the routed, shared and dense
    widths, dense layers (decoder_sparse_step, mlp_only_layers), q/k/v bias, heads, attention, dtype (and autocast),
    batch, seq."""
    rng = random.Random("qwen2_moe")
    out = []
    for _ in range(n):
        experts, heads = rng.randint(2, 6), rng.choice([2, 4])
        cfg = {**QWEN2_MOE, "num_experts": experts, "num_experts_per_tok": rng.randint(1, experts),
               "norm_topk_prob": rng.random() < 0.5, "qkv_bias": rng.random() < 0.5,
               "moe_intermediate_size": rng.choice([16, 24, 48]),
               "shared_expert_intermediate_size": rng.choice([8, 40, 96]),
               "hidden_size": heads * rng.choice([8, 16]), "num_attention_heads": heads,
               "num_key_value_heads": rng.choice([1, heads]), "num_hidden_layers": rng.randint(1, 3),
               "intermediate_size": rng.choice([24, 72])}
        if cfg["num_hidden_layers"] > 1:  # dense layers among the MoE ones, one way or the other
            cfg.update(rng.choice([{"decoder_sparse_step": 2}, {"mlp_only_layers": [0]}, {}]))
        dtype = rng.choice(["fp32", "bf16", "amp"])
        out.append((cfg, rng.choice(["eager", "sdpa"]), "fp32" if dtype == "amp" else dtype, dtype == "amp",
                    rng.randint(1, 3), rng.randint(5, 33)))
    return out


@pytest.mark.parametrize(("cfg", "attn", "dtype", "autocast", "batch", "seq"), _qwen2_moe_generated(5))
def test_qwen2_moe_shared_expert_and_routing_are_exact(cfg: dict, attn: str, dtype: str, autocast: bool,
                                                      batch: int, seq: int) -> None:
    """The shared expert's gated MLP, its output and sigmoid gate (and under autocast the three 16-bit casts of
    its input) beside the routed pairs' tensors, and the dense layers' MLPs, to the byte, on generated layouts."""
    config, m = run_hf(cfg, attn_implementation=attn, dtype=dtype, batch=batch, seq=seq, seed=5, autocast=autocast)
    assert config.impl.shared_expert_ff == cfg["shared_expert_intermediate_size"]
    assert config.param_count() == m.params
    p = predict_hf(config, m)
    assert p["activations"] == m.saved_bytes
    assert p["params"] + p["grads"] + p["optimizer"] == m.states_bytes


def test_qwen2_moe_shared_expert_is_active_and_multiplied() -> None:
    """Every token runs the shared expert and its gate: they count as active parameters and in the FLOPs."""
    from memlab.predict.compute.flops import forward_flops

    config = from_hf(QWEN2_MOE)
    plain = config.with_(impl=config.impl.__class__(**{**config.impl.__dict__, "shared_expert_ff": 0}))
    h, sf, L = config.d_model, QWEN2_MOE["shared_expert_intermediate_size"], config.n_layers
    shared = L * (3 * h * sf + h)
    assert config.param_count() - plain.param_count() == shared
    assert config.active_param_count() - plain.active_param_count() == shared
    assert forward_flops(config, 2, 8) - forward_flops(plain, 2, 8) == 2 * shared * 16


@pytest.mark.parametrize(("changes", "dense"), [({"decoder_sparse_step": 2}, (0, 2)), ({"mlp_only_layers": [3]}, (3,)),
                                              ({"decoder_sparse_step": 2, "mlp_only_layers": [1]}, (0, 1, 2))])
def test_qwen2_moe_dense_layers_count_as_dense_mlps(changes: dict, dense: tuple) -> None:
    """decoder_sparse_step and mlp_only_layers make some layers dense (intermediate_size wide): their MLP is in the
    parameters, every token multiplies it, and the routed experts a token skips are those of the MoE layers only."""
    from memlab.predict.compute.flops import forward_flops

    cfg = {**QWEN2_MOE, "num_hidden_layers": 4, **changes}
    config, moe = from_hf(cfg), from_hf({**cfg, "decoder_sparse_step": 1, "mlp_only_layers": []})
    assert config.impl.dense_layers == dense and config.moe_layers == 4 - len(dense)
    h, f, mf, sf = (cfg[k] for k in ("hidden_size", "intermediate_size", "moe_intermediate_size",
                                     "shared_expert_intermediate_size"))
    e, k, n = cfg["num_experts"], cfg["num_experts_per_tok"], len(dense)
    moe_block = e * h + e * 3 * h * mf + 3 * h * sf + h  # router, experts, shared expert, its gate
    active_block = e * h + k * 3 * h * mf + 3 * h * sf + h
    assert config.param_count() == moe.param_count() - n * moe_block + n * 3 * h * f
    assert config.inactive_expert_params() == config.moe_layers * (e - k) * 3 * h * mf
    assert config.active_param_count() == moe.active_param_count() - n * active_block + n * 3 * h * f
    assert forward_flops(config, 2, 8) - forward_flops(moe, 2, 8) == 2 * 16 * n * (3 * h * f - active_block)
    spread = abs(moe_block - 3 * h * f) * 2  # one block's bf16 gradients: MoE block less dense block
    notes = estimate(config, Setup(batch=1, seq=8, precision="bf16")).assumptions
    assert any(f"dense layers {list(dense)}" in a and f"up to {spread:,} B off" in a for a in notes)


@pytest.mark.parametrize("kwargs", [{"autocast": True}, {"gradient_checkpointing": True}])
def test_autocast_and_checkpointing_are_exact(kwargs: dict) -> None:
    """CPU autocast casts the router's input, not the grouped_mm experts (they run in fp32): no 16-bit expert copies."""
    config, m = run_hf(TINY, attn_implementation="eager", dtype="fp32", batch=2, seq=24, **kwargs)
    p = predict_hf(config, m)
    assert p["activations"] == m.saved_bytes
    assert p["params"] + p["grads"] + p["optimizer"] == m.states_bytes


def test_grouped_experts_count_like_one_tensor_per_expert() -> None:
    """Two 3-D tensors a layer hold the same parameters, active and multiplied, as E separate MLPs would."""
    grouped = from_hf(TINY)
    split = grouped.with_(impl=grouped.impl.__class__(**{**grouped.impl.__dict__, "grouped_experts": False}))
    names = [n for n, s, _ in grouped.param_shapes() if len(s) == 3]
    assert names == [f"blocks.{i}.mlp.experts.{w}" for i in range(grouped.n_layers) for w in ("gate_up", "down")]
    for count in ("param_count", "active_param_count", "matmul_param_count"):
        assert getattr(grouped, count)() == getattr(split, count)()
    assert grouped.inactive_expert_params(matmul_only=True) == split.inactive_expert_params(matmul_only=True) > 0


def test_no_moe_term_is_named_as_unmodelled() -> None:
    config = from_hf(TINY)
    setup = Setup(batch=2, seq=24, precision="bf16")
    assert not [t.name for t in estimate(config, setup).named_terms if "MoE" in t.name]


@pytest.mark.parametrize(("base", "changes", "key"), [
    (QWEN3_MOE, {"mlp_only_layers": [1]}, "mlp_only_layers"),
    (QWEN3_MOE, {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    (QWEN3_MOE, {"output_router_logits": True}, "output_router_logits"),
    (QWEN3_MOE, {"num_experts": 1, "num_experts_per_tok": 1}, "num_experts"),
    (QWEN2_MOE, {"mlp_only_layers": [0, 1]}, "mlp_only_layers"),
    (QWEN2_MOE, {"decoder_sparse_step": 3}, "decoder_sparse_step"),
    (QWEN2_MOE, {"output_router_logits": True}, "output_router_logits"),
    (QWEN2_MOE, {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    (QWEN2_MOE, {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size"),
] + [(TINY, *case) for case in [
    ({"output_router_logits": True}, "output_router_logits"),
    ({"router_jitter_noise": 0.05}, "router_jitter_noise"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ({"num_local_experts": 1, "num_experts_per_tok": 1}, "num_local_experts"),
]])
def test_what_is_not_modelled_is_refused_in_one_line(base: dict, changes: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_hf({**base, **changes})
    assert key in str(err.value) and "\n" not in str(err.value)


def test_cuda_autocast_is_refused_not_guessed() -> None:
    config = from_hf(TINY)
    with pytest.raises(SetupError, match="grouped_mm"):
        activation_bytes(config, Setup(batch=1, seq=16, precision="amp-bf16"), device_type="cuda")
    assert activation_bytes(config, Setup(batch=1, seq=16, precision="amp-bf16"), device_type="cpu")


@pytest.mark.parametrize("base", [TINY, QWEN3_MOE, QWEN2_MOE])
def test_frozen_layers_are_exact_and_lora_is_refused(base: dict) -> None:
    """Frozen lower layers keep nothing of theirs (measured exact); LoRA around grouped experts is not modelled."""
    frozen = Setup(batch=2, seq=24, precision="fp32", finetune="frozen", frozen_layers=1)
    config, m = run_hf(base, attn_implementation="eager", dtype="fp32", batch=2, seq=24, lora=frozen)
    p = predict_hf(config, m)
    assert p["activations"] == m.saved_bytes
    assert p["params"] + p["grads"] + p["optimizer"] == m.states_bytes
    for finetune in ("lora", "qlora"):
        with pytest.raises(SetupError, match="LoRA"):
            estimate(config, Setup(batch=2, seq=24, precision="bf16", finetune=finetune, lora_rank=4))


def test_grouped_experts_whose_rows_are_not_whole_16_byte_units_are_refused_as_the_real_step_fails() -> None:
    """torch's grouped_mm checks that every row stride is a multiple of 16 bytes, so an expert width (or hidden
    size) of, say, 52 bf16 elements makes the real step raise: the estimate refuses exactly those, on generated
    widths and dtypes, and gives a number for the others (whose real step runs)."""
    rng = random.Random(16)
    seen = set()
    for family, key in (("mixtral", "intermediate_size"), ("qwen2_moe", "moe_intermediate_size"),
                        ("qwen3_moe", "moe_intermediate_size")) * 2:
        cfg = {**json.loads((_DIR / f"{family}.json").read_text()), key: rng.choice((40, 50, 52, 56, 60))}
        dtype = rng.choice(("fp32", "bf16"))
        aligned = cfg[key] * (4 if dtype == "fp32" else 2) % 16 == 0
        try:
            run_hf(cfg, attn_implementation="eager", dtype=dtype, batch=2, seq=8)
            ran = True
        except RuntimeError as exc:
            assert "strides should be multiple of 16 bytes" in str(exc)
            ran = False
        assert ran == aligned, (family, cfg[key], dtype)
        setup = Setup(batch=2, seq=8, precision=dtype, attention="eager")
        if aligned:
            assert estimate(from_hf(cfg), setup, device_type="cpu").peak_bytes > 0
        else:
            with pytest.raises(SetupError, match="16 bytes") as err:
                estimate(from_hf(cfg), setup, device_type="cpu")
            assert "\n" not in str(err.value)
        seen.add(aligned)
    assert seen == {True, False}  # the draws hit both sides
