"""LoRA on every family memlab reads, formula against trace_hf: the formula answers only where its adapter rows
follow the family's block, and there it equals the trace; elsewhere it refuses with the trace as the way out
(coverage's "adapters in a block the formula's rows do not follow"). The trace holds one thing the formula leaves
to the loop: the batch's token ids and labels (2 x 8 B a token) and the loss (4 B), which no frozen embedding saves.
The targets reach peft under each family's own module names (memlab.model.hf.LORA_MODULE_NAMES): a wrong name is
silently skipped by peft when another matches, so the trace checks the adapted parameter count too."""

from __future__ import annotations

import pytest

from memlab import Setup, estimate, from_hf, load_config, trace_hf
from memlab.errors import SetupError
from memlab.predict.families.resolver import config_names

FAMILIES = [f for f in config_names("tiny") if not f.endswith("_moe") and f != "mixtral"]  # experts: refused
SAMPLE = ("llama", "gpt2", "opt", "phi3", "falcon")  # Llama names, fused qkv, own names, fused gate_up, parallel
"""In make test; every family in make bench (``wide``)."""


def _compare(family: str, targets: str) -> None:
    setup = Setup(batch=1, seq=8, finetune="lora", lora_targets=targets)
    cfg = load_config(family, "tiny")
    try:
        est = estimate(from_hf(cfg), setup, device_type="cpu", step_on_device=True)
    except SetupError as exc:
        assert "trace it" in str(exc) or "memlab estimate --hf answers from the trace" in str(exc), str(exc)
        return
    tr = trace_hf(cfg, setup, device_type="cpu")
    tc, pc = tr.components(), est.components()
    assert {k: tc[k] - pc[k] for k in ("params", "grads", "optimizer")} == {"params": 0, "grads": 0,
                                                                            "optimizer": 0}, family
    assert tc["activations"] - pc["activations"] == 2 * 8 * setup.tokens + 4, family


@pytest.mark.parametrize("family", [f if f in SAMPLE else pytest.param(f, marks=pytest.mark.wide) for f in FAMILIES])
def test_lora_on_every_linear_is_exact_or_refused_for_every_family(family: str) -> None:
    _compare(family, "all-linear")


@pytest.mark.wide
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("targets", ["", "q,v,o", "up,down"])
def test_lora_on_each_target_group_is_exact_or_refused_for_every_family(family: str, targets: str) -> None:
    _compare(family, targets)
