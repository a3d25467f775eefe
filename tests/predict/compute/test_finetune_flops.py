"""Issue 34, point 6: the FLOPs of a fine-tuning step (LoRA, frozen layers; transformers' gradient checkpointing),
checked against torch's own count of the real step: torch.utils.flop_counter.FlopCounterMode over a tiny peft model's
forward and backward on CPU, exact for every matmul."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from memlab.errors import ConfigError, SetupError
from memlab.predict.compute import flops as F
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.finetune import lora_modules
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

TINY = Path(__file__).resolve().parents[3] / "memlab" / "predict" / "families" / "configs" / "tiny"
CASES = [
    {"finetune": "lora", "lora_targets": "q,v"},
    {"finetune": "lora", "lora_targets": "o,down", "lora_rank": 4},
    {"finetune": "lora", "lora_targets": "q,k,v,o,gate,up,down", "lora_rank": 16},
    {"finetune": "lora", "lora_targets": "up"},
    {"finetune": "lora", "lora_targets": "v", "lora_modules_to_save": "head,embed"},
    {"finetune": "frozen", "frozen_layers": 1},
]


def _config() -> dict:
    return {k: v for k, v in json.loads((TINY / "llama.json").read_text()).items() if not k.startswith("_")}


def _counted(setup: Setup) -> int:
    """FlopCounterMode's total of one forward + backward of the tiny Llama under ``setup`` as memlab's runs build it
    (memlab.model.hf: peft LoRA or frozen blocks, transformers' gradient checkpointing), less the rotary table's
    (inv_freq @ positions: no weight matmul). CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``) has no
    formula in torch's registry: its forward is torch's sdpa_flop_count and its backward twice that (dQ, dK, dV and
    the scores' gradient; torch's sdpa_backward_flop_count adds the flash kernel's own recompute of QK^T, which is
    the kernel's business)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    from memlab.model.hf import apply_finetune, build_hf_model

    aten = torch.ops.aten
    sdpa = {aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *a, out_shape=None, **kw: 2 * sdpa_flop_count(q, k, v)}
    cfg = _config()
    checkpointed = setup.recompute == "full"  # memlab's runs: peft LoRA on memlab's targets, or bottom blocks frozen
    model = apply_finetune(build_hf_model(cfg, attn_implementation="sdpa", gradient_checkpointing=checkpointed,
                                          reentrant=setup.checkpoint_reentrant), setup)
    model.train()
    ids = torch.randint(0, cfg["vocab_size"], (setup.batch, setup.seq))
    with FlopCounterMode(display=False, custom_mapping=sdpa) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    rotary = sum(n for name, ops in counter.get_flop_counts().items() if name.endswith("rotary_emb")
                 for n in ops.values())
    return counter.get_total_flops() - rotary


@pytest.mark.parametrize("recompute", ["none", "full", "reentrant"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_closed_form_is_torchs_count_of_the_real_step(case: dict, recompute: str) -> None:
    """'reentrant': torch's reentrant checkpoint (peft's kbit preparation alone) runs every block again whole, its
    last matmul included, where the non-reentrant one stops at the last saved tensor."""
    pytest.importorskip("peft")
    setup = Setup(batch=2, seq=16, recompute="none" if recompute == "none" else "full",
                  checkpoint_reentrant=recompute == "reentrant", **case)
    step = F.step_flops(from_hf(_config()), setup)
    assert _counted(setup) == step.hardware
    assert step.model == step.forward + step.backward_input + step.backward_weight
    assert (step.recompute > 0) == (recompute != "none")
    if recompute == "reentrant":
        plain = F.step_flops(from_hf(_config()), setup.with_(checkpoint_reentrant=False))
        assert step.recompute > plain.recompute and step.model == plain.model


def test_full_training_is_megatrons_count() -> None:
    cfg = from_hf(_config())
    for recompute in ("none", "selective", "full"):
        step = F.step_flops(cfg, Setup(batch=2, seq=16, recompute=recompute))
        assert step.hardware == F.megatron_iteration_flops(cfg, 2, 16, recompute)
        assert step.model == 3 * F.forward_flops(cfg, 2, 16)


def test_lora_needs_no_weight_gradients_of_the_base() -> None:
    cfg = from_hf(_config())
    full = F.step_flops(cfg, Setup(batch=2, seq=16))
    lora = F.step_flops(cfg, Setup(batch=2, seq=16, finetune="lora", lora_rank=8, lora_targets="q,v"))
    adapters = 2 * 32 * 8 * ((64 + 64) + (64 + 32)) * 2  # t=32 tokens, r=8, q (64->64) and v (64->32), 2 blocks
    assert lora.backward_weight == adapters
    assert lora.forward == full.forward + adapters
    assert lora.model < full.model  # no weight-gradient GEMMs of the frozen base


@pytest.mark.parametrize("name", ["llama", "gpt2", "phi", "qwen2"])
def test_adapter_shapes_are_the_memory_models(name: str) -> None:
    cfg = from_hf(TINY / f"{name}.json")
    targets = ("q", "k", "v", "o", "up", "down")
    assert F.adapter_shapes(cfg, targets) == lora_modules(cfg, targets)


def test_refusals() -> None:
    with pytest.raises(ConfigError, match="no gate projection"):
        F.adapter_shapes(from_hf(TINY / "gpt2.json"), ("gate",))
    with pytest.raises(SetupError, match="mixture of experts"):
        F.step_flops(from_hf(TINY / "mixtral.json"), Setup(batch=1, seq=8, finetune="lora"))
    setup = Setup(batch=1, seq=8, finetune="frozen", frozen_layers=2)
    with pytest.raises(ConfigError, match="leave at least one"):
        F.step_flops(from_hf(_config()), setup)
    assert F.step_flops(preset("tiny-gpt"), replace(setup, frozen_layers=1)).backward_weight > 0


def test_torchtitans_policies_count_their_recompute_and_fine_tuning_refuses_them() -> None:
    """Full training under recompute='op' or recompute_every=k recomputes what recomputed_flops says (it raised a
    KeyError); a fine-tuning step under them is one SetupError line (its FLOPs are counted for none and full)."""
    from memlab.errors import SetupError
    from memlab.predict.compute.flops import recomputed_flops, step_flops
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup

    cfg = preset("tiny-llama")
    for kw in ({"recompute": "op"}, {"recompute": "full", "recompute_every": 2}):
        setup = Setup(seq=64, **kw)
        assert step_flops(cfg, setup).recompute == recomputed_flops(cfg, 1, 64, setup.recompute,
                                                                    recompute_every=setup.recompute_every) > 0
        with pytest.raises(SetupError, match="not counted"):
            step_flops(cfg, setup.with_(finetune="lora"))
