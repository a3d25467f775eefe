"""QLoRA under FSDP2 as the FSDP-QLoRA recipe runs it, traced (memlab.tracing.hf, memlab.model.hf): rank 0's
sharded states hand-counted from the model's own parameters, bitsandbytes' quantisation state on every rank, and the
fake trace equal to the same step with real tensors, where bitsandbytes' own fix-up restores the quantisation state."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from memlab.predict.spec.setup import Setup

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from memlab.model.hf import apply_finetune, build_hf_model, hf_config, quant_state_bytes
from memlab.predict.memory.fsdp import rank0_shard_elements
from memlab.tracing.hf import trace_hf

LLAMA = {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 510, "max_position_embeddings": 64, "tie_word_embeddings": False}
"""A tiny generated Llama whose vocabulary (510 rows) does not divide by 4: FSDP2 pads the embedding and the head."""
SETUP = Setup(batch=1, seq=16, precision="bf16", attention="flash", finetune="qlora", lora_targets="all-linear",
              zero_stage=3)


def _hand_count(world_size: int, config: object = None, setup: Setup = SETUP) -> dict[str, int]:
    """Rank 0's bytes at rest from the model's own parameters (real tensors, built as the trace builds it): every
    parameter a dim-0 shard of ``ceil(d0 / N)`` rows (FSDP2's padding, rank 0 always full), the packed 4-bit
    weights among them in bf16 storage; the quantisation state whole; the adapters' fp32 gradients and AdamW's two
    fp32 moments sharded like them, and one fp32 step count per adapter (torch.optim.AdamW's ``state['step']``);
    ``root``: the root unit's parameters gathered (embedding, final norm, head; N x rank 0's padded shard)."""
    setup = setup.with_(world_size=world_size)
    model = apply_finetune(build_hf_model(config or hf_config("llama", **LLAMA), dtype="bf16"), setup)
    packed = [p for p in model.parameters() if getattr(p, "quant_state", None) is not None]
    assert packed and all(p.dtype.itemsize == 2 for p in packed)  # quant_storage=bf16

    def shard(p) -> int:
        return rank0_shard_elements(tuple(p.shape), world_size) * p.element_size()

    adapters = [p for p in model.parameters() if p.requires_grad]
    root = [p for name, p in model.named_parameters() if ".layers." not in name]
    last = [p for name, p in model.named_parameters() if f".layers.{LLAMA['num_hidden_layers'] - 1}." in name]
    grads = sum(shard(p) for p in adapters)
    return {"parameters": sum(shard(p) for p in model.parameters()) + quant_state_bytes(model),
            "quant_state": quant_state_bytes(model), "gradients": grads,
            "optimizer states": 2 * grads + 4 * len(adapters), "root": world_size * sum(shard(p) for p in root),
            "layer": world_size * sum(shard(p) for p in last)}


@functools.cache
def _one_process() -> object:
    """The same step on one process (no FSDP), its 4-bit weights in bitsandbytes' default uint8 storage."""
    return trace_hf(hf_config("llama", **LLAMA), SETUP.with_(zero_stage=0), device_type="cpu")


@pytest.mark.parametrize("world_size", [pytest.param(2, marks=pytest.mark.wide), 4])  # 2 ranks: make bench
def test_qlora_under_fsdp2_shards_the_packed_weights_and_adapters_and_keeps_the_quant_state_whole(
        world_size: int) -> None:
    """At rest rank 0 holds a shard of every parameter (the bf16-stored 4-bit weights, norms, embedding, head,
    adapters), of the adapters' gradients and AdamW states, and the whole quantisation state (no parameter: FSDP
    leaves it on every rank); in the forward the root unit stays gathered (FSDP2 does not reshard the root). Beside
    the one-process step, a decoder layer's all-gather buffer (N x its padded shard, packed weights as bytes) is
    live at both peaks: the last layer's until the root's post-forward at the loss, the prefetched one in the
    backward of the head."""
    hand = _hand_count(world_size)
    traced = trace_hf(hf_config("llama", **LLAMA), SETUP.with_(world_size=world_size), device_type="cpu")
    rest = traced.phase("optimizer step", "steady").end_by_category
    assert {k: rest[k] for k in ("parameters", "gradients", "optimizer states")} == \
        {k: hand[k] for k in ("parameters", "gradients", "optimizer states")}
    forward = traced.phase("forward", "steady").by_category
    assert forward["parameters"] == hand["parameters"] + hand["root"]
    one = _one_process()
    assert forward["activations"] - one.phase("forward", "steady").by_category["activations"] == hand["layer"]
    backward = traced.phase("backward", "steady").by_category
    assert backward["temporaries"] - one.phase("backward", "steady").by_category["temporaries"] == hand["layer"]
    assert any("FSDP-QLoRA recipe" in note for note in traced.notes)


def test_qlora_under_fsdp2_fake_trace_equals_the_step_with_real_tensors() -> None:
    """The real step (real tensors over the same fake process group) runs bitsandbytes' own fix-up, which wraps the
    gathered weight in a Params4bit; the fake trace sets the same attributes by a hook (restore_quant_state): the
    same bytes, phase by phase (the first optimizer step aside: DTensor's first sharding propagation on fake
    tensors, marked unreliable)."""
    cfg, setup = hf_config("llama", **LLAMA), SETUP.with_(world_size=2, kbit_prepare=True)
    fake, real = trace_hf(cfg, setup, device_type="cpu"), trace_hf(cfg, setup, fake=False, device_type="cpu")
    rows = [[(r.step, r.phase, r.peak_bytes, r.end_bytes, r.by_category) for r in t.phases
             if (r.step, r.phase) != ("first", "optimizer step")] for t in (fake, real)]
    assert rows[0] == rows[1]


def test_memlab_estimate_answers_qlora_under_fsdp_from_the_trace_and_says_why_the_formula_does_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``memlab estimate --hf CONFIG --finetune qlora --zero 3 --world-size 2``: the formula refuses (its FSDP2 terms
    count one dtype and a gradient per parameter), the trace answers, rank 0's states the hand-count's."""
    from memlab import cli

    path = str(Path(__file__).resolve().parents[2] / "memlab/predict/families/configs/tiny/llama.json")
    assert cli.main(["estimate", "--hf", path, "--finetune", "qlora", "--zero", "3", "--world-size", "2", "--seq", "16",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source_of_truth"] == "trace" and "in one dtype" in out["formula_refused"]
    rest = next(r for r in out["phases"] if (r["step"], r["phase"]) == ("steady", "optimizer step"))["end_by_category"]
    hand = _hand_count(2, path, Setup(finetune="qlora", precision="bf16"))
    assert [rest[k] for k in ("parameters", "gradients", "optimizer states")] == \
        [hand[k] for k in ("parameters", "gradients", "optimizer states")]


def test_a_mixed_precision_gather_that_would_cast_the_packed_weights_is_one_clear_error() -> None:
    """MixedPrecisionPolicy(param_dtype=fp16) casts every floating parameter for the all-gather, the bf16-stored
    4-bit weights too, whose bits are packed NF4: refused in one line, with the way out."""
    from memlab.errors import SetupError

    with pytest.raises(SetupError, match="fsdp_param_dtype 'none' or 'bf16'") as err:
        trace_hf(hf_config("llama", **LLAMA), SETUP.with_(world_size=2, fsdp_param_dtype="fp16"), device_type="cpu")
    assert "\n" not in str(err.value)
