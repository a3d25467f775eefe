"""Expert parallelism traced on a fake process group (memlab.tracing.experts) against the per-rank estimate
(memlab.predict.parallel.experts): exact, with two residuals named: the loss scalar the trace files under activations
and the estimator's rows count as none (4 bytes), and Adam's per-tensor step counters (4 bytes a tensor)."""

from __future__ import annotations

import pytest

from memlab.errors import SetupError
from memlab.predict.parallel.experts import expert_estimate
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.experts import trace_gpt_ep
from memlab.tracing.gpt import trace_gpt

SHAPES = [
    (preset("tiny-moe").with_(n_layers=1, vocab_size=128, n_experts=4), Setup(batch=2, seq=16, world_size=2, ep=2)),
    (TransformerConfig(name="gelu-top1", d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=128, max_seq=64,
                       n_experts=4, top_k=1), Setup(batch=1, seq=16, world_size=4, ep=4, precision="mixed-bf16")),
]
"""Top-2 of 4 SwiGLU experts with a shared expert and rotary positions (fp32, ep=2); top-1 GELU with learned positions
(mixed-bf16: bf16 weights with fp32 master copies, ep=4)."""


@pytest.mark.parametrize(("config", "setup"), SHAPES, ids=["top2-swiglu-shared", "top1-gelu-mixed-bf16"])
def test_rank_bytes_match_the_trace(config: TransformerConfig, setup: Setup) -> None:
    trace = trace_gpt_ep(config, setup, device_type="cpu")
    r = expert_estimate(config, setup, device_type="cpu")
    tensors = sum(1 for n, _, _ in config.param_shapes() if ".experts." not in n or
                  int(n.split(".experts.")[1].split(".")[0]) < config.n_experts // setup.ep)
    inputs = 2 * setup.batch * setup.seq * 8  # the token ids and the targets (int64), 'inputs' in the trace
    step = trace.phase("optimizer step")
    assert step.end_by_category["parameters"] == (r.dense_params + r.expert_params) * setup.policy.param_bytes
    assert step.end_bytes == r.states_bytes + r.buffers_bytes + inputs + 4 * tensors  # + Adam's step counters
    forward = trace.phase("forward").end_by_category
    assert forward["activations"] + forward["inputs"] - 4 == r.activations_bytes  # - the loss scalar
    assert trace.peak_bytes <= r.peak_bytes  # the estimate's peak adds every gradient to every activation


def test_trace_refuses_what_it_does_not_run() -> None:
    for s in (Setup(ep=2, world_size=2, zero_stage=1, seq=16), Setup(ep=2, world_size=2, seq=16, ep_routing="worst"),
              Setup(seq=16)):
        with pytest.raises(SetupError, match="trace_gpt_ep traces expert parallelism alone"):
            trace_gpt_ep(preset("tiny-moe"), s, device_type="cpu")


def test_other_traces_refuse_ep() -> None:
    with pytest.raises(SetupError, match="trace_gpt_ep") as info:
        trace_gpt(preset("tiny-moe"), Setup(ep=2, world_size=2, zero_stage=3, seq=16))
    assert "\n" not in str(info.value)


def test_the_reference_moe_on_one_device_is_refused_in_one_line_on_fake_tensors(capsys) -> None:
    """Its routing reads the router's values (torch.nonzero), which fake tensors lack: one line naming the ways out,
    never a DynamicOutputShapeException traceback (found by the generated traced-search test)."""
    from memlab import cli

    with pytest.raises(SetupError, match="routes each token by its router's values"):
        trace_gpt(preset("tiny-moe"), Setup(batch=1, seq=8))
    assert cli.main(["trace", "tiny-moe", "--batch", "1", "--seq", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trace_gpt_ep" in err[0] and "memlab estimate" in err[0]
