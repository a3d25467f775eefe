"""``memlab shard --hf PATH``: transformers' model on gloo ranks (FSDP2 per decoder layer and the root, DDP), each
rank's bytes next to ``memlab estimate --hf PATH --zero 3``, exact or the residual named (issue 17, point 7)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from memlab import cli
from memlab.cli.shard import _own_rows, named_residuals, residual
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.fsdp import rank0_shard_elements
from memlab.run.distributed.launch import DistributedRun, WorkerSpec
from memlab.run.distributed.worker import run_strategy
from memlab.tracing.fake_dist import fake_process_group

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs"
TINY_LLAMA = json.loads((CONFIGS / "tiny" / "llama.json").read_text())


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _odd_llama(seed: int) -> dict:
    """A tiny Llama whose vocabulary and widths do not divide by 2 ranks (FSDP2 pads them): generated, not picked."""
    rng = random.Random(seed)
    heads = rng.choice((3, 5))
    return {**TINY_LLAMA, "vocab_size": rng.randrange(301, 601, 2), "hidden_size": 4 * heads * rng.choice((3, 5)),
            "num_attention_heads": heads, "num_key_value_heads": 1, "intermediate_size": rng.randrange(51, 121, 2),
            "num_hidden_layers": 1}


def test_every_rank_holds_its_rows_of_every_shape() -> None:
    """FSDP2's chunks: the ranks' own rows add up to dim 0, none exceeds rank 0's padded chunk."""
    rng = random.Random(0)
    for _ in range(200):
        d0, n = rng.randrange(1, 5000), rng.randrange(1, 17)
        rows = [_own_rows(d0, n, r) for r in range(n)]
        assert sum(rows) == d0 and rows[0] * 1 == rank0_shard_elements((d0,), n) and max(rows) == rows[0]


def test_a_residual_is_exact_named_or_said_not_explained() -> None:
    cfg = from_hf(_odd_llama(1))
    row = {"strategy": "fsdp2-zero3", "world_size": 2, "rank": 1, "comm": {}}
    named = named_residuals(cfg, row)
    assert set(named) == {"optimizer", "gathered params", "comm volume/step"} and named["optimizer"][0] < 0
    assert residual(0, None) == "exact"
    assert residual(named["optimizer"][0], named["optimizer"]).endswith("padded one")
    assert "not explained" in residual(named["optimizer"][0] + 4, named["optimizer"])
    assert named_residuals(cfg, {**row, "rank": 0}).get("optimizer") is None  # rank 0 holds full chunks


def test_shard_hf_refuses_what_it_cannot_compare_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "model_type": "cohere"}))
    for argv, words in ((["--hf", str(tmp_path)], ("formula does not cover", "cohere", "estimate --hf")),
                        (["--hf", str(CONFIGS / "tiny" / "llama.json"), "--layouts"], ("drop --layouts",)),
                        (["--hf", str(CONFIGS / "tiny" / "llama.json"), "--preset", "gpt2"], ("drop one",)),
                        (["--hf", str(tmp_path / "none.json")], ("no config file",))):
        code, _, err = _run(capsys, "shard", *argv, "--cpu")
        assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err


def _fake_launch(raw: dict, strategies: tuple[str, ...], ranks: int = 2) -> DistributedRun:
    """What ``memlab shard --hf`` launches, run here rank after rank over a fake process group
    (:func:`memlab.tracing.fake_dist.fake_process_group`: collectives return at once, so the values are garbage but
    every tensor is real): each rank's own bytes and collectives, without torchrun. The real gloo ranks run in
    ``benchmarks/shard_hf.py`` (make bench)."""
    spec = WorkerSpec(config=from_hf(raw), hf_config=raw, strategies=strategies, steps=1, seq=16,
                      device="cpu").to_dict()
    rows = []
    for rank in range(ranks):
        with fake_process_group(ranks, rank=rank):
            rows += [run_strategy(s, spec, rank, ranks, torch.device("cpu")) for s in strategies]
    return DistributedRun(ranks, tuple(rows), ("fake",), 0.0)


def test_shard_hf_prints_each_rank_next_to_estimate_zero3_exact_or_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A generated tiny Llama (dims 2 ranks do not divide: FSDP2 pads them) under FSDP2 ZeRO-3, each rank of 2
    (DDP's C++ reducer does not run over the fake group: the benchmark runs it on gloo): the model states are exact
    where the shards are even, every other residual is its named term to the byte, and the prediction is memlab
    estimate --hf PATH --zero 3's (plus the CPU's step counters)."""
    from memlab.cli import shard

    raw = _odd_llama(2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    seen: list = []

    def launched(spec: WorkerSpec, args: object, *, sweep: bool = False) -> DistributedRun:
        seen.append(spec)  # the same spec both times below: its ranks run once
        if len(seen) == 1:
            seen.append(_fake_launch(spec.hf_config, spec.strategies))
        return seen[1]

    monkeypatch.setattr(shard, "_launch", launched)
    code, out, err = _run(capsys, "shard", "--hf", str(path), "--ranks", "2", "--cpu", "--seq", "16",
                          "--json")
    assert code == 0, err
    assert seen[0].hf_config == raw and seen[0].strategies == ("fsdp2-zero3",)  # --hf's default
    d = json.loads(out)
    assert d["family"] == "llama" and d["traits"] == json.loads(json.dumps(from_hf(raw).impl.differs()))
    assert d["source_of_truth"] == "measurement" and "AutoModelForCausalLM" in d["calling_convention"]
    rows = d["per_rank"]
    assert {(r["strategy"], r["rank"]) for r in rows} == {("fsdp2-zero3", 0), ("fsdp2-zero3", 1)}
    assert all(r["explained"] for r in rows), [r for r in rows if not r["explained"]]
    zero3 = {(r["rank"], r["component"]): r for r in rows if r["strategy"] == "fsdp2-zero3"}
    assert all(zero3[(k, c)]["residual"] == "exact" for k in (0, 1) for c in ("params", "grads"))
    assert zero3[(0, "optimizer")]["residual"] == "exact" != zero3[(1, "optimizer")]["residual"]
    assert zero3[(0, "gathered params")]["error"] > 0 > zero3[(0, "comm volume/step")]["error"]
    code, out, err = _run(capsys, "estimate", "--hf", str(path), "--zero", "3", "--world-size", "2", "--batch", "2",
                          "--seq", "16", "--json")
    assert code == 0, err
    per_device = json.loads(out)["per_device"]  # estimate assumes CUDA: AdamW's step counters on the host
    assert all(zero3[(0, c)]["predicted"] == per_device[c] for c in ("params", "grads"))
    assert zero3[(0, "optimizer")]["predicted"] - per_device["optimizer"] == 4 * len(from_hf(raw).param_shapes())
    code, out, _ = _run(capsys, "shard", "--hf", str(path), "--ranks", "2", "--cpu", "--seq", "16")
    assert code == 0 and "not explained" not in out and out.count("exact") >= 5


def test_the_loss_of_a_wrapped_hf_model_is_its_own() -> None:
    """DDP keeps the model as ``.module``: step_loss still calls it as a transformers causal LM (labels=ids)."""
    from memlab.model.fsdp import blocks_of, step_loss
    from memlab.model.hf import build_hf_model
    from memlab.model.step import token_ids

    class Wrapper(torch.nn.Module):
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, **kw: object) -> object:
            return self.module(**kw)

    model = build_hf_model(TINY_LLAMA)
    idx = token_ids(TINY_LLAMA["vocab_size"], 1, 8)
    assert torch.equal(step_loss(Wrapper(model), idx, idx), model(input_ids=idx, labels=idx).loss)
    assert blocks_of(model) is model.model.layers and len(blocks_of(model)) == TINY_LLAMA["num_hidden_layers"]
    with pytest.raises(Exception, match="inside"):
        step_loss(model, idx, idx, "outside")
