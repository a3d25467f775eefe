"""memlab.measure.accounting: storage-deduplicated bytes of model states and of tensors saved for backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memlab.measure.accounting import (
    SavedTensorRecorder,
    model_states,
    optimizer_state_bytes,
    storage_key,
    unique_storage_bytes,
)
from memlab.model.gpt import GPT
from memlab.model.step import MasterWeights
from memlab.predict.spec.model import preset
from memlab.predict.spec.precision import precision_policy


def test_views_of_one_storage_count_once() -> None:
    t = torch.zeros(100)
    views = [t, t[:10], t.view(10, 10), t.view(10, 10).T, t[::2], t.unsqueeze(0)]
    assert unique_storage_bytes(views) == 400
    assert storage_key(t[50:]) == storage_key(t)


def test_a_view_counts_its_whole_storage_and_distinct_tensors_add_up() -> None:
    big, small = torch.zeros(1000, dtype=torch.float64), torch.zeros(3, dtype=torch.int8)
    assert unique_storage_bytes([big[:1]]) == 8000  # the slice keeps the whole buffer alive
    assert unique_storage_bytes([big[:1], small, small.clone()]) == 8000 + 3 + 3
    assert unique_storage_bytes([big.clone()[:1]]) == 8000


def test_none_empty_and_meta_tensors_count_nothing() -> None:
    assert unique_storage_bytes([None, torch.empty(0), torch.empty(10, device="meta")]) == 0
    assert storage_key(torch.empty(5, device="meta")) is None


def test_device_filter_keeps_only_that_device() -> None:
    t = torch.zeros(10)
    assert unique_storage_bytes([t], torch.device("cpu")) == 40
    assert unique_storage_bytes([t], torch.device("cuda")) == 0


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.ones(3))


def test_model_states_counts_a_tied_embedding_once() -> None:
    m = Tied()
    st = model_states(m)
    assert st.params_bytes == 10 * 4 * 4
    assert st.buffers_bytes == 3 * 4
    assert st.grads_bytes == 0 and st.optimizer_bytes == 0 and st.optimizer_by_key == {}
    cfg = preset("tiny-gpt")  # tied LM head
    gpt = GPT(cfg)
    assert model_states(gpt).params_bytes == cfg.param_count() * 4
    untied = cfg.with_(tied_embeddings=False)
    assert model_states(GPT(untied)).params_bytes == untied.param_count() * 4


def test_gradients_of_a_tied_weight_count_once_and_bf16_halves() -> None:
    cfg = preset("tiny-gpt")
    for dtype, width in ((torch.float32, 4), (torch.bfloat16, 2)):
        gpt = GPT(cfg, dtype=dtype)
        idx = torch.randint(0, cfg.vocab_size, (1, 8))
        gpt(idx, idx).backward()
        st = model_states(gpt)
        assert st.params_bytes == st.grads_bytes == cfg.param_count() * width
        assert st.total_bytes == 2 * cfg.param_count() * width


def test_adamw_state_by_key_with_step_counters() -> None:
    m = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    n = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), foreach=False)
    assert model_states(m, opt).optimizer_bytes == 0  # lazy: nothing before the first step
    m(torch.randn(2, 8)).sum().backward()
    opt.step()
    st = model_states(m, opt)
    # exp_avg and exp_avg_sq like the params; one 0-dim fp32 step tensor per parameter tensor (4 tensors).
    assert st.optimizer_by_key == {"step": 4 * 4, "exp_avg": 4 * n, "exp_avg_sq": 4 * n}
    assert st.optimizer_bytes == 8 * n + 16
    assert st.grads_bytes == 4 * n
    opt.zero_grad(set_to_none=True)
    assert model_states(m, opt).grads_bytes == 0


def test_optimizer_state_that_aliases_a_parameter_is_not_counted_twice() -> None:
    p = nn.Parameter(torch.zeros(10))

    class Holder:
        def __init__(self) -> None:
            self.state = {p: {"alias": p, "own": torch.zeros(5), "nested": [p.detach(), {"x": torch.zeros(2)}]}}

    assert optimizer_state_bytes(Holder(), exclude=[p]) == {"alias": 0, "own": 20, "nested": 8}


def test_master_weight_wrapper_states_and_fp32_grad_buffers() -> None:
    m = nn.Linear(8, 8).to(torch.bfloat16)
    n = 8 * 8 + 8
    policy = precision_policy("mixed-bf16-fp32-grads")
    mw = MasterWeights(m, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), policy)
    m(torch.randn(2, 8, dtype=torch.bfloat16)).float().sum().backward()
    st = model_states(m, mw)
    # bf16 grads were folded into fp32 buffers and freed: the buffers ARE the gradients (4 B/param).
    assert all(p.grad is None for p in m.parameters())
    assert st.params_bytes == 2 * n and st.grads_bytes == 4 * n
    assert st.optimizer_by_key == {"master": 4 * n}
    mw.step()
    st = model_states(m, mw)
    assert st.optimizer_by_key == {"master": 4 * n, "momentum_buffer": 4 * n}
    mw.remove_hooks()


def test_recorder_excludes_parameters_and_buffers() -> None:
    lin = nn.Linear(5, 7)
    x = torch.randn(3, 5, requires_grad=True)
    with SavedTensorRecorder(lin) as rec:
        y = lin(x)
    # addmm saves its input and the weight; the weight is a parameter: only x is an activation.
    assert rec.result().total_bytes == 3 * 5 * 4
    with SavedTensorRecorder() as bare:
        lin(x)
    assert bare.result().total_bytes == 3 * 5 * 4 + 5 * 7 * 4
    # tiny-llama saves every weight but the embedding table (its backward needs only the ids), and the rotary
    # cos/sin buffers: a recorder without the model sees exactly those on top of the activations.
    cfg = preset("tiny-llama")
    gpt = GPT(cfg)
    idx = torch.zeros(1, 8, dtype=torch.long)
    with SavedTensorRecorder(gpt) as rec:
        gpt(idx, idx)
    with SavedTensorRecorder() as bare:
        gpt(idx, idx)
    buffers = unique_storage_bytes(gpt.buffers())
    assert buffers == 2 * cfg.max_seq * cfg.head_dim // 2 * 4
    saved_weights = (cfg.param_count() - cfg.vocab_size * cfg.d_model) * 4
    assert bare.result().total_bytes - rec.result().total_bytes == saved_weights + buffers
    assert y.shape == (3, 7)


def test_recorder_deduplicates_a_tensor_saved_by_several_ops_and_names_the_module() -> None:
    class Two(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * x).sum() + x.sin().sum() + x.view(-1).cos().sum()

    m = nn.Sequential(nn.Identity(), Two())
    x = torch.randn(4, 6, requires_grad=True)
    with SavedTensorRecorder(m) as rec:
        out = m(x)
    res = rec.result()
    assert res.total_bytes == 4 * 6 * 4  # x saved by mul (twice), sin and cos: one storage
    assert res.by_category() == {"Two": 96}
    frame = res.to_frame()
    assert list(frame.columns) == ["nbytes", "dtype", "shape", "category", "scope", "grad_fn"]
    assert frame.loc[0, "scope"] == "1" and frame.loc[0, "dtype"] == "float32"
    out.backward()  # the hooks left the saved tensors usable
    assert x.grad is not None


def test_recording_changes_neither_loss_nor_gradients() -> None:
    cfg = preset("tiny-gpt")
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for record in (False, True):
        torch.manual_seed(0)
        gpt = GPT(cfg, recompute="full")
        if record:
            with SavedTensorRecorder(gpt):
                loss = gpt(idx, idx)
        else:
            loss = gpt(idx, idx)
        loss.backward()
        grads.append([p.grad for p in gpt.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_recorder_removes_its_hooks_and_repairs_scope_after_an_error() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    m = nn.Sequential(nn.Linear(2, 2), Boom())
    rec = SavedTensorRecorder(m)
    with pytest.raises(RuntimeError, match="boom"), rec:
        m(torch.randn(1, 2, requires_grad=True))
    assert not m._forward_hooks and not m._forward_pre_hooks
    assert not m[0]._forward_hooks and not m[1]._forward_pre_hooks
    x = torch.randn(3, requires_grad=True)
    with SavedTensorRecorder() as after:
        (x * x).sum()
    assert after.result().total_bytes == 12


def test_recorder_excludes_the_storage_a_parameter_holds_when_a_tensor_is_saved() -> None:
    """A module that swaps its bias's storage during its forward (bitsandbytes' Linear4bit casts it in place on its
    first call): the old storage, now an ordinary tensor, is an activation when saved; the new one is the
    parameter. A recorder keyed on the storages of before the swap would count them the other way round (on a
    real run the old address is freed and may be reused by any activation: a count short by the bias's bytes)."""

    class Swaps(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.randn(6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            old = self.bias.data
            self.bias.data = old.to(torch.float64)  # a new storage; ``old`` is no longer a parameter
            return (x * old).sum() + (x * self.bias.float()).sum() + (x.double() * self.bias).sum()

    x = torch.randn(4, 6, requires_grad=True)
    # x * old saves old (x only if old needed a gradient); x * bias.float() saves x and the fp32 copy;
    # x.double() * bias saves the fp64 x and the fp64 bias
    saved = {"old": 6 * 4, "x": 4 * 6 * 4, "fp32 copy": 6 * 4, "fp64 x": 4 * 6 * 8, "fp64 bias": 6 * 8}
    with SavedTensorRecorder() as bare:
        Swaps()(x).backward()
    assert bare.result().total_bytes == sum(saved.values())
    m = Swaps()
    with SavedTensorRecorder(m) as rec:
        m(x).backward()
    assert rec.result().total_bytes == sum(saved.values()) - saved["fp64 bias"]
