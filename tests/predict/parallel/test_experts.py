"""Expert parallelism per rank (memlab.predict.parallel.experts, ``ep_sent_bytes``): generated MoE configs and setups
against counts made independently (parameters by name, routing by enumeration, states by bytes per parameter)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.parallel.communication import ep_sent_bytes
from memlab.predict.parallel.experts import (
    capacity_pairs,
    ep_layouts,
    expert_estimate,
    expert_param_elements,
    received_pairs,
)
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

RNG = random.Random(19)


def _config(rng: random.Random) -> TransformerConfig:
    E = rng.choice([2, 4, 8, 16])
    heads = rng.choice([2, 4])
    return TransformerConfig(name="draw", d_model=heads * rng.choice([8, 16]), n_layers=rng.randint(1, 4),
                             n_heads=heads, d_ff=rng.choice([32, 48, 64]), vocab_size=rng.choice([64, 128]),
                             max_seq=128, n_experts=E, top_k=rng.randint(1, min(E, 4)),
                             n_shared_experts=rng.choice([0, 0, 1]), mlp=rng.choice(["gelu", "swiglu"]),
                             positions=rng.choice(["learned", "rotary"]), bias=rng.choice([True, False]))


DRAWS = [(_config(RNG), RNG.choice([1, 2, 4]), RNG.choice([1, 2]), RNG.choice([0, 1, 2, 3]), RNG.randint(0, 99))
         for _ in range(16)]


@pytest.mark.parametrize(("config", "ep", "dp_extra", "zero", "seed"), DRAWS)
def test_states_split_experts_over_ep_and_zero_over_their_group(config: TransformerConfig, ep: int, dp_extra: int,
                                                                zero: int, seed: int) -> None:
    ep = math.gcd(ep, config.n_experts)
    ws = ep * dp_extra
    s = Setup(batch=1, seq=16, zero_stage=zero, world_size=ws, ep=ep, attention="flash")
    dense, expert = expert_param_elements(config, s)
    by_name = sum(math.prod(sh) for n, sh, _ in config.param_shapes() if ".experts." in n)
    assert expert * ep == by_name and dense + by_name == config.param_count()
    r = expert_estimate(config, s)
    # fp32 AdamW: 4 (param) + 4 (grad) + 8 (two moments) bytes; ZeRO-1 shards the moments, 2 also the grads, 3 all
    def per_rank(n: int, ranks: int) -> float:
        shard = [(4, 4, 8), (4, 4, 8 / ranks), (4, 4 / ranks, 8 / ranks), (4 / ranks, 4 / ranks, 8 / ranks)][zero]
        return n * sum(shard)
    assert r.states_bytes == pytest.approx(per_rank(dense, ws) + per_rank(expert, ws // ep), rel=1e-3, abs=64)
    assert r.local_experts == config.n_experts // ep


@pytest.mark.parametrize(("config", "ep", "dp_extra", "zero", "seed"), DRAWS[:8])
def test_balanced_activations_do_not_depend_on_ep_and_worst_bounds_them(config: TransformerConfig, ep: int,
                                                                        dp_extra: int, zero: int, seed: int) -> None:
    s = Setup(batch=2, seq=16, world_size=8, attention="flash")
    rows = {e: expert_estimate(config, s.with_(ep=e)) for e in (1, 2) if config.n_experts % e == 0}
    assert rows[1].activations_bytes == rows[2].activations_bytes  # t k pairs per rank whatever ep
    worst = expert_estimate(config, s.with_(ep=2, ep_routing="worst"))
    assert worst.received_pairs == 2 * 32 * min(config.top_k, config.n_experts // 2)
    assert worst.activations_bytes >= rows[2].activations_bytes
    assert worst.peak_bytes >= rows[2].peak_bytes
    assert rows[2].states_bytes < rows[1].states_bytes  # half the experts' states


def test_worst_case_pairs_match_an_enumeration_of_every_choice() -> None:
    for E, k, ep in [(4, 1, 2), (4, 2, 2), (6, 3, 3), (8, 2, 4), (8, 3, 2)]:
        local = set(range(E // ep))  # rank 0's experts
        most = max(len(local & set(c)) for c in itertools.combinations(range(E), k))
        assert received_pairs(5, k, E, ep, "worst") == ep * 5 * most
        assert received_pairs(5, k, E, ep, "balanced") == 5 * k


def test_capacity_caps_each_expert_at_c_times_its_share() -> None:
    assert capacity_pairs(64, 2, 8, 4, 1.0) == 64 * 2  # C = 1: each expert t k ep / E pairs, E / ep local
    assert capacity_pairs(64, 2, 8, 4, 1.25) == 2 * math.ceil(1.25 * 4 * 64 * 2 / 8)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(SetupError, match="capacity_factor"):
            capacity_pairs(64, 2, 8, 4, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_ep_sent_bytes_counts_four_all_to_alls_of_the_remote_pairs(seed: int) -> None:
    rng = random.Random(seed)
    t, h, L, k, ep, v = rng.randint(1, 5000), rng.choice([64, 4096]), rng.randint(1, 64), rng.randint(1, 4), \
        rng.choice([1, 2, 4, 8, 64]), rng.choice([2, 4])
    pair = h * v
    assert ep_sent_bytes(t, h, L, k, ep, v) == pytest.approx(L * 4 * t * k * pair * (ep - 1) / ep)
    n_exp = ep * rng.choice([1, 2, 4])
    if n_exp >= k:  # the hot rank: every token of every rank picks m of its experts; count its sends pair by pair
        m = min(k, n_exp // ep)
        dispatch = t * (k - m)  # its own tokens' pairs whose expert is elsewhere
        combine = (ep - 1) * t * m  # the pairs other ranks sent it, returned
        assert ep_sent_bytes(t, h, L, k, ep, v, "worst", n_exp) == L * 2 * (dispatch + combine) * pair
        assert ep_sent_bytes(t, h, L, k, ep, v, "worst", n_exp) >= ep_sent_bytes(t, h, L, k, ep, v) or ep == 1
    with pytest.raises(SetupError, match="routing"):
        ep_sent_bytes(t, h, L, k, ep, v, "skewed")
    with pytest.raises(SetupError, match="needs n_experts"):
        ep_sent_bytes(t, h, L, k, ep, v, "worst")


def test_refusals_are_one_line() -> None:
    moe, dense = preset("tiny-moe"), preset("tiny-gpt")
    cases = [
        (lambda: Setup(ep=3, world_size=4), "must divide world_size"),
        (lambda: estimate(moe, Setup(ep=2, world_size=2, pp=2, micro_batches=2, seq=16)), "pp > 1"),
        (lambda: expert_estimate(moe, Setup(ep=3, world_size=3, seq=16)), "must divide n_experts"),
        (lambda: expert_estimate(dense, Setup(ep=2, world_size=2, seq=16)), "has none"),
        (lambda: expert_estimate(moe, Setup(ep=2, world_size=2, seq=16, precision="amp-bf16")), "autocast"),
        (lambda: estimate(moe, Setup(ep=2, world_size=2, seq=16, loss="fused")), "not modelled"),
    ]
    for call, match in cases:
        with pytest.raises(SetupError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_estimate_answers_ep_as_one_expert_parallel_rank() -> None:
    """One estimate: ep is answered as an expert-parallel rank, its states split into the components."""
    moe = preset("tiny-moe")
    setup = Setup(ep=2, world_size=2, seq=16)
    bd, rep = estimate(moe, setup), expert_estimate(moe, setup)
    assert bd.peak_bytes == rep.peak_bytes and bd.model_state_bytes() == rep.states_bytes
    assert bd.activations_bytes == rep.activations_bytes and len(bd.ranks) == 1
    assert bd.ranks[0].detail["received_pairs"] == rep.received_pairs and bd.layout["kind"] == "experts"


def test_mixtral_layouts_shrink_states_not_balanced_activations() -> None:
    df = ep_layouts(preset("mixtral-8x7b"), Setup(batch=1, seq=4096, precision="bf16", attention="flash",
                                                   zero_stage=1, world_size=8))
    bal = df[df.routing == "balanced"]
    assert list(bal.ep) == [1, 2, 4, 8] and bal.states_bytes.is_monotonic_decreasing
    assert bal.activations_bytes.nunique() == 1 and (bal.sent_bytes.diff().dropna() > 0).all()


@pytest.mark.parametrize("seed", range(4))
def test_tp_recompute_and_zero3_compose_with_ep(seed: int) -> None:
    rng = random.Random(100 + seed)
    config = _config(rng).with_(n_heads=4, d_model=64)
    ep = math.gcd(2, config.n_experts)
    s = Setup(batch=2, seq=16, world_size=4, ep=ep, attention="flash", precision=rng.choice(["fp32", "mixed-bf16"]))
    base = expert_estimate(config, s)
    tp2 = expert_estimate(config, s.with_(tp=2))
    assert base.expert_params / 2 <= tp2.expert_params < base.expert_params  # d_ff split, row-parallel biases kept
    assert tp2.routed_activations_bytes < base.routed_activations_bytes
    full = expert_estimate(config, s.with_(recompute="full"))
    assert full.routed_activations_bytes == 0 and full.activations_bytes < base.activations_bytes
    assert full.transient_bytes > base.transient_bytes  # one block's recomputed tensors, routed ones included
    z3 = expert_estimate(config, s.with_(zero_stage=3))
    z2 = expert_estimate(config, s.with_(zero_stage=2))
    block = sum(math.prod(sh) for n, sh, _ in config.param_shapes() if n.startswith("blocks.0."))
    block_local = block - sum(math.prod(sh) for n, sh, _ in config.param_shapes()
                              if n.startswith("blocks.0.") and ".experts." in n) * (ep - 1) // ep
    assert z3.transient_bytes - z2.transient_bytes == block_local * s.policy.param_bytes  # a gathered block
    assert z3.states_bytes < z2.states_bytes
