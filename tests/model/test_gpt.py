"""memlab.model.gpt: the reference model matches its config exactly, attention kernels and recompute agree numerically,
the KV cache decodes like a full forward, and bad setups get one clear error."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import SetupError
from memlab.model.gpt import GPT, available_attention
from memlab.model.kv_cache import KVCache
from memlab.predict.spec.model import PRESETS, TransformerConfig, preset

CUSTOM = TransformerConfig(name="custom-nobias", d_model=48, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=80,
                           vocab_size=97, max_seq=64, bias=False, norm="layernorm", tied_embeddings=False)
SMALL = ["tiny-gpt", "tiny-llama"]


def _cfg(name: str) -> TransformerConfig:
    return CUSTOM if name == CUSTOM.name else preset(name)


def _tokens(cfg: TransformerConfig, b: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (b, s), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(PRESETS))
def test_meta_model_has_exactly_the_configs_parameters(name: str) -> None:
    cfg = preset(name)
    model = GPT(cfg, device="meta")
    assert model.num_params() == cfg.param_count()
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert sorted(got) == sorted((n, s) for n, s, _ in cfg.param_shapes())
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("name", ["tiny-gpt", "gpt2"])
def test_tied_head_reuses_the_embedding_storage(name: str) -> None:
    model = GPT(preset(name), device="meta")
    assert model.head is None and model.head_weight is model.tok_emb.weight
    untied = GPT(preset(name).with_(tied_embeddings=False), device="meta")
    assert untied.head_weight is not untied.tok_emb.weight
    assert untied.num_params() - model.num_params() == preset(name).vocab_size * preset(name).d_model


def test_cpu_attention_backends_are_eager_math_flash() -> None:
    # torch 2.13 on CPU: the memory-efficient and cuDNN SDPA kernels are CUDA-only.
    works = available_attention("cpu")
    assert works[:3] == ["eager", "math", "flash"]
    assert "efficient" not in works and "cudnn" not in works


@pytest.mark.parametrize("name", [*SMALL, CUSTOM.name])
def test_attention_implementations_give_the_same_loss_and_grads(name: str) -> None:
    cfg = _cfg(name)
    idx, tgt = _tokens(cfg, 2, 17), _tokens(cfg, 2, 17, seed=1)
    results = {}
    for att in ("eager", "math", "flash"):
        torch.manual_seed(0)
        model = GPT(cfg, attention=att)
        loss = model(idx, tgt)
        loss.backward()
        results[att] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    ref_loss, ref_grads = results["eager"]
    # A random-init model predicts roughly uniformly: loss ~ ln(V), which says the logits are wired to the vocab.
    assert abs(ref_loss.item() - torch.log(torch.tensor(float(cfg.vocab_size))).item()) < 0.5
    for att in ("math", "flash"):
        loss, grads = results[att]
        torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref_grads[n], atol=1e-5, rtol=1e-4, msg=f"{att}: {n}")


@pytest.mark.parametrize("attention", ["eager", "flash"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_changes_memory_not_results(attention: str, recompute: str) -> None:
    cfg = preset("tiny-llama")
    idx, tgt = _tokens(cfg, 2, 16), _tokens(cfg, 2, 16, seed=1)
    out = []
    for rec in ("none", recompute):
        torch.manual_seed(0)
        model = GPT(cfg, attention=attention, recompute=rec)
        loss = model(idx, tgt)
        loss.backward()
        out.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=0, atol=0)
    for a, b in zip(out[0][1], out[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", ["eager", "math", "flash"])
def test_attention_is_causal(attention: str) -> None:
    cfg = preset("tiny-gpt")
    model = GPT(cfg, attention=attention).eval()
    idx = _tokens(cfg, 1, 12)
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


@pytest.mark.parametrize("attention", ["eager", "math", "flash"])
@pytest.mark.parametrize("name", SMALL)
def test_kv_cache_decode_equals_full_forward(attention: str, name: str) -> None:
    cfg = preset(name)
    torch.manual_seed(0)
    model = GPT(cfg, attention=attention).eval()
    idx = _tokens(cfg, 2, 12)
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(cfg, 2, 12)
        steps = [model(idx[:, :8], cache=cache)]
        steps += [model(idx[:, i : i + 1], cache=cache) for i in range(8, 12)]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_kv_cache_size_is_preallocated_gqa_aware() -> None:
    cfg = preset("tiny-llama")  # 2 KV heads of 16
    cache = KVCache(cfg, 3, 20, dtype=torch.bfloat16)
    assert cache.nbytes() == 2 * cfg.n_layers * 3 * 20 * cfg.n_kv_heads * cfg.head_dim * 2
    before = cache.nbytes()
    model = GPT(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        model(_tokens(cfg, 3, 5), cache=cache)
    assert cache.nbytes() == before and cache.length == 5


def test_sequence_longer_than_max_seq_is_a_setup_error() -> None:
    cfg = preset("tiny-gpt").with_(max_seq=16)
    model = GPT(cfg)
    with pytest.raises(SetupError, match="max_seq=16"):
        model(_tokens(cfg, 1, 17))
    cache = KVCache(cfg, 1, 16)
    with torch.no_grad():
        model(_tokens(cfg, 1, 16), cache=cache)
        with pytest.raises(SetupError, match="exceeds max_seq"):
            model(_tokens(cfg, 1, 1), cache=cache)


@pytest.mark.parametrize("attention", ["efficient", "cudnn"])
def test_unavailable_sdpa_backend_names_what_works(attention: str) -> None:
    cfg = preset("tiny-gpt")
    model = GPT(cfg, attention=attention)
    with pytest.raises(SetupError) as info:
        model(_tokens(cfg, 1, 8), _tokens(cfg, 1, 8))
    msg = str(info.value)
    assert attention in msg and "cpu" in msg
    assert "eager" in msg and "math" in msg and "flash" in msg
    assert "\n" not in msg


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch explains why each fused kernel declined
def test_flash_with_dropout_on_cpu_is_refused_with_the_kernels_that_work() -> None:
    cfg = preset("tiny-gpt").with_(dropout=0.1)
    model = GPT(cfg, attention="flash").train()
    with pytest.raises(SetupError, match=r"dropout 0\.1") as info:
        model(_tokens(cfg, 1, 8), _tokens(cfg, 1, 8))
    assert "eager" in str(info.value)


@pytest.mark.parametrize(("kwargs", "word"), [({"attention": "fast"}, "attention"),
                                              ({"recompute": "some"}, "recompute")])
def test_bad_constructor_arguments(kwargs: dict, word: str) -> None:
    with pytest.raises(SetupError, match=word):
        GPT(preset("tiny-gpt"), device="meta", **kwargs)


def test_dropout_is_active_in_train_and_off_in_eval() -> None:
    cfg = preset("tiny-gpt").with_(dropout=0.5)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = _tokens(cfg, 1, 8)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(idx), model(idx))
        model.train()
        assert not torch.equal(model(idx), model(idx))


def test_bf16_model_runs_and_keeps_its_dtype() -> None:
    cfg = preset("tiny-llama")
    model = GPT(cfg, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rotary is not None and model.rotary.cos.dtype == torch.float32  # rotary tables stay fp32
    loss = model(_tokens(cfg, 1, 8), _tokens(cfg, 1, 8))
    assert loss.dtype == torch.float32  # logits cast to fp32 before the loss
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in model.parameters())
