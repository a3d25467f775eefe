"""CUDA-only checks of the runner and the ledger: they run on a real GPU and skip, with the reason, elsewhere.

They pin the device-dependent assumptions of :mod:`memlab.predict.memory.activations` that a CPU cannot check (CUDA
autocast keeps softmax in fp32, CUDA layer_norm keeps fp32 statistics, the fused kernels' output is the output
projection's input, the efficient kernel pads its log-sum-exp) and that the allocator sees at least what the
accounting counts.
"""

from __future__ import annotations

import pytest
import torch

from memlab.compare.ledger import compare, predict_for
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.runner import run_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: this machine's torch sees none"),
]


@pytest.mark.parametrize(
    ("precision", "attention", "recompute"),
    [
        ("amp-bf16", "eager", "none"),  # CUDA autocast: fp32 softmax plus its bf16 copy
        ("mixed-bf16", "eager", "none"),  # 16-bit layer_norm with fp32 statistics on CUDA
        ("amp-bf16", "flash", "none"),
        ("amp-fp16", "efficient", "none"),  # log-sum-exp padded to 32 rows
        ("amp-bf16", "eager", "selective"),
        ("bf16", "flash", "full"),
    ],
)
def test_cuda_saved_activations_match_the_cuda_prediction(precision: str, attention: str, recompute: str) -> None:
    cfg = preset("small-gpt")
    m = run_step(cfg, Setup(batch=4, seq=96, precision=precision, attention=attention, recompute=recompute), "cuda",
                 steps=1, with_counted_flops=False, with_mfu=False)
    assert m.status == "ok", m.error
    predicted = predict_for(cfg, m)
    assert predicted.activation_detail == m.activations_by_category
    assert (predicted.params_bytes, predicted.grads_bytes) == (m.params_bytes, m.grads_bytes)


def test_cuda_allocator_peak_covers_the_accounted_states() -> None:
    cfg = preset("gpt2")
    m = run_step(cfg, Setup(batch=4, seq=512, precision="amp-bf16", attention="flash"), "cuda", steps=2,
                 with_counted_flops=False)
    table = compare(predict_for(cfg, m), m)
    peak = table.set_index("component").loc["allocator peak (max_memory_allocated)"]
    assert peak["measured"] >= m.params_bytes + m.grads_bytes + m.optimizer_bytes
    assert m.mfu is not None and 0 < m.mfu < 1, m.mfu_reason
    assert any(c.startswith("residual") for c in table["component"])


def test_cuda_oom_is_recorded_and_the_next_run_works() -> None:
    from memlab.measure.cuda import emulate_smaller_gpu

    cfg = preset("gpt2-medium")
    with emulate_smaller_gpu(2 * 2**30):
        m = run_step(cfg, Setup(batch=16, seq=1024, precision="fp32"), "cuda", steps=1, with_counted_flops=False,
                     with_mfu=False)
    assert m.status == "oom"
    assert m.oom["tried_to_allocate_bytes"] > 0
    ok = run_step(preset("tiny-gpt"), Setup(batch=2, seq=32), "cuda", steps=1, with_counted_flops=False, with_mfu=False)
    assert ok.status == "ok"


def test_cuda_kv_cache_inference_matches_the_estimate() -> None:
    cfg = preset("tiny-llama")
    setup = Setup(mode="inference", batch=4, seq=128, inference_weights="bf16", kv_cache_dtype="bf16",
                  attention="flash")
    m = run_step(cfg, setup, "cuda", steps=4, with_counted_flops=False)
    assert m.kv_cache_bytes == predict_for(cfg, m).kv_cache_bytes


def test_cuda_phase_peaks_are_allocator_peaks_per_phase() -> None:
    """Issue 9: per-phase max_memory_allocated (reset at each phase) against the predicted phases and peak."""
    cfg = preset("gpt2")
    m = run_step(cfg, Setup(batch=2, seq=512, precision="fp32", attention="flash"), "cuda", steps=1,
                 with_counted_flops=False, with_mfu=False)
    assert m.status == "ok", m.error
    rows = {(r.step, r.phase): r for r in m.phase_peaks}
    assert len(rows) == 8 and all("max_memory_allocated" in r.source for r in rows.values())
    assert all(r.peak_bytes >= r.end_bytes for r in rows.values())
    predicted = predict_for(cfg, m)
    # the allocator rounds every block up to 512 B and keeps cuBLAS workspaces: a few per cent above the tensors
    assert 0.97 <= m.peak_bytes / predicted.peak_bytes <= 1.10
    table = compare(predicted, m)
    assert "peak (inside the step)" in set(table["component"])
