"""The shoot-out on the published rows: each tool asked only what it claims, on a few of the ledger's rows (no
network; the tools whose code is a package are called in the CI-scale chapter and the benchmark)."""

from __future__ import annotations

import pandas as pd
import pytest

from memlab.compare.published import published_rows
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.korthikanti import korthikanti_layer_bytes
from memlab.predict.spec.model import preset
from memlab.studies import shootout
from memlab.studies.formulas import KORTHIKANTI

FORMULA_TOOLS = ("memlab", "gpu_poor", KORTHIKANTI, "torchtitan")


def _rows(*ids: str):
    return tuple(r for r in published_rows() if r.row_id in ids)


def _cell(frame, row_id: str, tool: str):
    return frame[(frame["row_id"] == row_id) & (frame["tool"] == tool)].iloc[0]


@pytest.mark.parametrize("name", ["llama-3-8b", "gpt2-medium"])
def test_hf_of_a_preset_counts_the_presets_parameters(name):
    assert from_hf(shootout.hf_of(preset(name))).param_count() == preset(name).param_count()


def test_one_token_inference_row_is_scored_on_the_weights():
    frame = shootout.published_shootout(_rows("td-01"), tools=FORMULA_TOOLS)
    guides = _cell(frame, "td-01", KORTHIKANTI)
    row = _rows("td-01")[0]
    assert guides["comparison"] == "scored"
    assert guides["predicted"] * 1e9 == pytest.approx(2 * preset("llama-2-7b").param_count())
    assert guides["residual"] == pytest.approx(guides["predicted"] / row.figure - 1)
    assert _cell(frame, "td-01", "gpu_poor")["comparison"] == "scored"
    assert _cell(frame, "td-01", "torchtitan")["comparison"] == "not expressible"


def test_nvidia_smi_row_is_compared_without_the_context_the_source_measured_alone():
    frame = shootout.published_shootout(_rows("hf-v100-01", "hf-v100-02"), tools=("memlab", KORTHIKANTI))
    line = _cell(frame, "hf-v100-02", KORTHIKANTI)
    assert line["target"] == pytest.approx(2631 - 1343)
    assert "hf-v100-01" in line["note"]
    assert (frame[frame["row_id"] == "hf-v100-01"]["comparison"] == "not expressible").all()


def test_sharded_full_recompute_row_is_a_bound_for_the_guides_and_out_of_one_gpu_tools():
    frame = shootout.published_shootout(_rows("tt-h100-07", "tt-h100-01"), tools=FORMULA_TOOLS)
    cfg, line = preset("llama-3-8b"), _cell(frame, "tt-h100-07", KORTHIKANTI)
    states = 16 * cfg.param_count() / 8
    acts = cfg.n_layers * korthikanti_layer_bytes(32768, 1, cfg.d_model, cfg.n_heads, recompute="full")
    assert line["comparison"] == "bound" and pd.isna(line["residual"])
    assert line["predicted"] * 2**30 == pytest.approx(states + acts)
    assert _cell(frame, "tt-h100-07", "gpu_poor")["note"] == "one GPU, no sharding"
    assert "per-op policy" in _cell(frame, "tt-h100-01", KORTHIKANTI)["note"]  # torchtitan's op SAC: no form


def test_mfu_row_scores_the_flops_formulas_and_says_the_source_used_torchtitans():
    frame = shootout.published_shootout(_rows("tt-a100-02"), tools=FORMULA_TOOLS)
    titan, guides = _cell(frame, "tt-a100-02", "torchtitan"), _cell(frame, "tt-a100-02", KORTHIKANTI)
    assert titan["comparison"] == guides["comparison"] == "scored"
    assert "not a prediction" in titan["note"]
    assert guides["predicted"] < titan["predicted"]  # 6N leaves out the attention's 12 l h q t
    assert _cell(frame, "tt-a100-02", "gpu_poor")["comparison"] == "not expressible"


def test_summary_counts_every_cell_once_and_table_has_a_cell_per_tool():
    frame = shootout.published_shootout(_rows("td-01", "tt-h100-07", "tt-a100-02"), tools=FORMULA_TOOLS)
    summary = shootout.shootout_summary(frame)
    total = summary[summary["kind"] == "all"].set_index("tool")
    assert (total["scored"] + total["bound"] + total["not_expressible"] == total["rows"]).all()
    assert total["median_abs_residual"].isna().all()  # no median across kinds of figure
    table = shootout.shootout_table(frame)
    assert list(table.columns) == ["published", *FORMULA_TOOLS]
    assert table.loc["td-01", "torchtitan"].startswith("n/e: ")
    assert table.loc["tt-h100-07", KORTHIKANTI].startswith("part ")


@pytest.mark.wide  # builds empty 7B/8B models with transformers (seconds): make bench
def test_package_tools_answer_their_own_scope():
    frame = shootout.published_shootout(_rows("td-01", "tt-h100-07"), tools=("accelerate", "deepspeed"))
    acc = _cell(frame, "td-01", "accelerate")
    assert acc["comparison"] == "scored" and "no LM head" in acc["claim"]
    assert _cell(frame, "tt-h100-07", "accelerate")["note"] == "one device, no sharding or model parallelism"
    ds = _cell(frame, "tt-h100-07", "deepspeed")
    assert ds["comparison"] == "bound" and "ZeRO-3" in ds["claim"] and ds["share"] < 1
    assert _cell(frame, "td-01", "deepspeed")["note"] == "model states of full training only"
