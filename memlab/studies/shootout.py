"""The calculator shoot-out on the published GPU measurements: every tool asked only what it claims, on the ledger's
rows (``data/published/ledger.csv``, :mod:`memlab.compare.published`).

A published figure is a whole (a step's peak allocated or reserved bytes, nvidia-smi's used memory, an MFU); most
public calculators claim a part of it. So each (row, tool) cell is one of:

- ``scored``: the tool's claim is the figure's quantity, so the residual ``(predicted - target) / target`` is
  reported. The target is the figure, or, for an nvidia-smi row whose source also published its CUDA context alone
  (the same source's context-only row), the figure less that context: no tool here counts the context.
- ``bound``: the tool claims a part of what the figure counts (model states, states and per-layer activations with
  the head and loss not charged, states without activations); the part is not published on its own, so the figure
  bounds it from above: ``share`` is predicted / target, and a share above 1 is an error of the tool.
- ``not expressible``: the tool cannot be asked about this run (its recipe, optimizer, parallel layout or
  fine-tuning method is not one it models), with the reason.

The tools, each on its own scope (their code called where they have code, :mod:`memlab.studies.calculators`):

- ``memlab``: :func:`memlab.compare.published_predict.predict_row` (peak allocated of one device; an MFU from the
  published throughput);
- ``accelerate``: ``accelerate estimate-memory``'s "Total Size" of the empty base model in the row's weight dtype
  (scored on a batch-1, one-token inference row: the figure is the loaded weights and one token), and its
  "Training using Adam" figure (a bound: batch 1, no activations) on one-device Adam training
  ``[accelerate-estimate]``;
- ``deepspeed``: ``estimate_zero3_model_states_mem_needs`` (ZeRO-3/FSDP rows) or ``estimate_zero2_...`` over the
  row's data-parallel ranks, for mixed-precision full training with Adam: model states only, a bound
  ``[deepspeed-zero]``;
- ``gpu_poor``: its 2-byte weights on a bf16 one-token inference row (scored), its states on one-GPU 16-bit
  LoRA/QLoRA/full Adam training (a bound; its activations assume no checkpointing) ``[gpu-poor]``;
- :data:`~memlab.studies.formulas.KORTHIKANTI` (Transformer Math 101 / the Ultra-Scale Playbook): states 16 B/param
  sharded as the Playbook's ZeRO-3 ``16 N / N_d`` (ZeRO-2 ``(2 + 14 / N_d) N``), plus Korthikanti et al.'s per-layer
  activations with the row's tensor and sequence parallelism, context parallel shards and recompute (a bound: the
  head and loss are not charged), and 6N FLOPs per token for an MFU row (scored) ``[anthony2023]`` ``[tazi2025]``
  ``[korthikanti2022]``;
- ``torchtitan``: its MFU formula ``6 x all parameters + 12 l h q t`` FLOPs per token (torchtitan/utils.py@0413364
  l.111-119, as the ledger's rows cite it) on an MFU row (scored); its memory estimator
  (scripts/estimate/estimation.py ``[torchtitan-fsdp]``, :mod:`memlab.studies.titan`) is not run on the rows.

Every MFU uses the peak memlab's :func:`~memlab.predict.compute.flops.mfu` uses for the row's GPU, so the tools
differ only in FLOPs per token. A row's model is its ``memlab_model`` (the closest config where its ``memlab_gap``
names one) for every tool alike. Rows whose figure is a time or a throughput are left out (no tool here predicts
kernel time); :func:`published_shootout` says how many. Nothing is fitted to these rows.
"""

from __future__ import annotations

import functools
from statistics import median
from typing import TYPE_CHECKING, Any

from memlab.compare.published import MEMORY_UNITS, PublishedRow, published_rows
from memlab.compare.published_predict import predict_row
from memlab.predict.memory.korthikanti import korthikanti_layer_bytes
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.studies.formulas import KORTHIKANTI

if TYPE_CHECKING:
    import pandas as pd

TOOLS = ("memlab", "accelerate", "deepspeed", "gpu_poor", KORTHIKANTI, "torchtitan")
"""The tools, in table order."""

SHOOTOUT_KINDS = ("max_allocated", "reserved", "active", "nvidia_smi_used", "other", "mfu")
"""The kinds of figure the shoot-out compares (memory peaks and MFU); time and throughput rows are left out."""

SCORED, BOUND, NOT_EXPRESSIBLE = "scored", "bound", "not expressible"


def _cell(kind: str, predicted: float | None = None, claim: str = "", note: str = "") -> dict[str, Any]:
    """One tool's answer: ``kind`` scored / bound / not expressible, ``predicted`` in bytes (memory) or % (MFU)."""
    return {"comparison": kind, "predicted_raw": predicted, "claim": claim, "note": note}


def _na(reason: str) -> dict[str, Any]:
    return _cell(NOT_EXPRESSIBLE, note=reason)


# -- what a row asks ---------------------------------------------------------------------------------------------
def _f(row: PublishedRow) -> dict[str, Any]:
    """The row's memlab setup with memlab's defaults filled in where the row is silent."""
    f = row.setup_fields
    return {"mode": f.get("mode", "train"), "finetune": f.get("finetune", "full"),
            "precision": f.get("precision", "fp32"), "optimizer": f.get("optimizer", "adamw"),
            "world": f.get("world_size", 1), "zero": f.get("zero_stage", 0), "tp": f.get("tp", 1),
            "sp": f.get("sp", False), "cp": f.get("cp", 1), "recompute": f.get("recompute", "none"),
            "batch": f.get("batch", 1), "seq": f.get("seq", 1), "attention": f.get("attention", "auto"),
            "offload": f.get("fsdp_offload", False), "param16": f.get("fsdp_param_dtype") in ("bf16", "fp16"),
            "weights": f.get("inference_weights", "fp32"), "lora_rank": f.get("lora_rank", 8),
            "lora_targets": f.get("lora_targets", "")}


def _config(row: PublishedRow) -> TransformerConfig | None:
    """The row's model as memlab's preset (None for a bare parameter count or no model)."""
    return preset(row.memlab_model) if row.memlab_model and not row.memlab_model.startswith("params:") else None


def _mixed(f: dict[str, Any]) -> bool:
    """16-bit compute over fp32 master weights and fp32 Adam states: FSDP2's bf16 param policy over fp32 shards."""
    return f["param16"] or f["precision"] in ("mixed-bf16", "amp-bf16", "amp-fp16")


def _one_token_inference(f: dict[str, Any]) -> bool:
    """A batch-1, one-token inference row: what is allocated is the loaded weights and one token's forward."""
    return f["mode"] == "inference" and f["batch"] == 1 and f["seq"] == 1


def hf_of(config: TransformerConfig) -> dict[str, Any]:
    """An HF config dict of a memlab preset, for the tools that read one (a ``llama`` config for a SwiGLU preset,
    else ``gpt2``): the sizes are the preset's, and :func:`~memlab.predict.families.reader.from_hf` of the result
    counts the preset's parameters (checked in the tests)."""
    if config.mlp == "swiglu":
        return {"model_type": "llama", "hidden_size": config.d_model, "intermediate_size": config.d_ff,
                "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
                "num_key_value_heads": config.n_kv_heads, "vocab_size": config.vocab_size,
                "max_position_embeddings": config.max_seq, "tie_word_embeddings": config.tied_embeddings}
    return {"model_type": "gpt2", "n_embd": config.d_model, "n_layer": config.n_layers, "n_head": config.n_heads,
            "n_inner": config.d_ff, "vocab_size": config.vocab_size, "n_positions": config.max_seq}


@functools.lru_cache(maxsize=16)
def _empty_sizes(name: str, base: bool) -> tuple[int, int, int]:
    """accelerate's and DeepSpeed's sizes of the preset's empty model
    (:func:`memlab.studies.calculators._empty_model_sizes`)."""
    from memlab.studies.calculators import _empty_model_sizes

    return _empty_model_sizes(tuple(sorted(hf_of(preset(name)).items())), base)


def _target(row: PublishedRow, rows: tuple[PublishedRow, ...]) -> tuple[float, str]:
    """What a row's tools are compared against, in the row's unit: the figure, or an nvidia-smi figure less the CUDA
    context the same source measured alone (its context-only row: same source, no model, its gap the context)."""
    if row.kind != "nvidia_smi_used":
        return row.figure, ""
    ctx = next((r for r in rows if r.source_id == row.source_id and r.kind == row.kind and r.row_id != row.row_id
                and not r.memlab_model and "CUDA context" in r.memlab_gap), None)
    if ctx is None:
        return row.figure, ""
    value = (row.figure_bytes - ctx.figure_bytes) / MEMORY_UNITS[row.unit]
    return value, f"compared with the figure less the CUDA context the source measured alone ({ctx.row_id})"


def _peak_flops(row: PublishedRow, f: dict[str, Any]) -> float | None:
    """The dense bf16 peak memlab's :func:`~memlab.predict.compute.flops.mfu` uses for the row's GPU (every
    tool's MFU is over this one peak)."""
    from memlab.errors import MemlabError
    from memlab.predict.compute.flops import mfu

    if not (row.memlab_gpu and row.tokens_per_s_per_device and row.memlab_model):
        return None
    model = _config(row) or float(row.memlab_model[7:])
    try:
        return mfu(model, float(row.tokens_per_s_per_device), accelerator=row.memlab_gpu, seq=f["seq"],
                   dtype="bf16").peak_flops_per_s
    except MemlabError:
        return None


def _mfu_of(row: PublishedRow, f: dict[str, Any], flops_per_token: float, claim: str) -> dict[str, Any]:
    """An MFU cell: the published tokens/s/GPU times the tool's FLOPs per token over memlab's peak, in %."""
    peak = _peak_flops(row, f)
    if peak is None:
        return _na("no memlab peak FLOP/s for this GPU, or no published throughput to divide")
    return _cell(SCORED, 100 * float(row.tokens_per_s_per_device) * flops_per_token / peak, claim,
                 f"over memlab's dense bf16 peak {peak / 1e12:,.0f} TFLOP/s")


def _params_of(row: PublishedRow) -> int:
    """The row's parameter count: memlab's exact count of its config, or the source's ``params:N``."""
    cfg = _config(row)
    return cfg.param_count() if cfg is not None else int(row.memlab_model[7:])


# -- the tools ---------------------------------------------------------------------------------------------------
def memlab_cell(row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """memlab's figure for the row (:func:`~memlab.compare.published_predict.predict_row`): its peak allocated
    bytes of one device, or its MFU of the published throughput."""
    p = predict_row(row)
    if p.predicted is None:
        return _na(f"memlab {p.status}: {p.note}")
    if row.kind == "mfu":
        return _cell(SCORED, p.predicted, "MFU of the published tokens/s (memlab's FLOPs per token)")
    how = "on the closest config its memlab_gap names" if row.memlab_gap else (
        f"with {row.memlab_approx}" if p.status == "approximated" else "")
    return _cell(SCORED, p.predicted * MEMORY_UNITS[row.unit], "peak allocated bytes of one device",
                 f"{p.status} {how}".strip())


_ACCELERATE_DIVISOR = {"fp32": 1, "bf16": 2, "fp16": 2, "int8": 4, "int4": 8}
"""accelerate's ``gather_data``: the fp32 total size divided per dtype (float16 /2, int8 /4, int4 /8; bf16 has
float16's width)."""


def accelerate_cell(row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """``accelerate estimate-memory`` on the row: "Total Size" for a one-token inference row (scored), "Training
    using Adam" (the largest of ``estimate_training_usage``'s terms, batch 1, no activations) as a bound on
    one-device Adam training. ``[accelerate-estimate]``"""
    from accelerate.commands.estimate import estimate_training_usage

    cfg = _config(row)
    if row.kind == "mfu" or cfg is None:
        return _na("a memory estimator: no FLOPs" if row.kind == "mfu" else "no config of the model to build")
    total = _empty_sizes(row.memlab_model, True)[0]
    if _one_token_inference(f):
        if f["weights"] not in _ACCELERATE_DIVISOR:
            return _na(f"no {f['weights']} dtype among its float32/float16/int8/int4")
        return _cell(SCORED, total / _ACCELERATE_DIVISOR[f["weights"]],
                     "'Total Size': the empty base model in the weights' dtype (no LM head)")
    why = _one_device_adam(f, "accelerate")
    if why:
        return _na(why)
    usage = estimate_training_usage(total, "float16" if _mixed(f) else "float32")
    return _cell(BOUND, float(max(usage.values())), "'Training using Adam': batch 1, states and step, no "
                                                     "activations")


def _one_device_adam(f: dict[str, Any], tool: str) -> str:
    """Why a one-device full-training Adam tool cannot express the row ('' when it can)."""
    if f["mode"] != "train":
        return "a generation run beyond one token: no claim for it"
    if f["finetune"] != "full":
        return f"no {f['finetune']} mode: full training only"
    if f["world"] > 1 or f["tp"] > 1 or f["cp"] > 1:
        return "one device, no sharding or model parallelism"
    if f["optimizer"] != "adamw":
        return f"assumes Adam with fp32 states, not {f['optimizer']}"
    if not _mixed(f) and f["precision"] != "fp32":
        return f"assumes fp32 weights (fp32 training or mixed precision), not pure {f['precision']}"
    return ""


def deepspeed_cell(row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's ZeRO-3 (FSDP/ZeRO-3 rows) or ZeRO-2 model-states estimator over the row's data-parallel ranks,
    no offload: a bound (model states only) on mixed-precision full training with Adam. ``[deepspeed-zero]``"""
    cfg = _config(row)
    if row.kind == "mfu" or cfg is None:
        return _na("model states only: no FLOPs" if row.kind == "mfu" else "no config of the model to build")
    if f["mode"] != "train" or f["finetune"] != "full":
        return _na("model states of full training only")
    if f["optimizer"] != "adamw" or not (f["param16"] or f["precision"] == "mixed-bf16"):
        return _na(f"assumes 16-bit weights and gradients, fp32 master weights and Adam states, not "
                   f"{f['precision']} with {f['optimizer']} (autocast keeps fp32 weights and gradients)")
    if f["tp"] > 1 or f["offload"]:
        return _na("tensor parallelism is not in its estimators" if f["tp"] > 1 else "offload: CPU bytes")
    from memlab.studies.calculators import _quiet_deepspeed_accelerator

    _quiet_deepspeed_accelerator()
    stage = 3 if f["zero"] >= 3 else 2
    try:
        if stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as est
        else:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as est
    except Exception as exc:  # DeepSpeed can fail at import for many machine reasons (no compiler, no CUDA)
        return _na(f"DeepSpeed cannot be imported here ({type(exc).__name__})")
    n, ranks = cfg.param_count(), f["world"]
    if stage == 2:
        gpu = est(n, num_gpus_per_node=ranks, num_nodes=1, cpu_offload=False)[1]
    else:
        largest = _empty_sizes(row.memlab_model, False)[2]
        gpu = est(n, largest, num_gpus_per_node=ranks, num_nodes=1, cpu_offload=False, cpu_offload_params=False)[1]
    return _cell(BOUND, float(gpu), f"ZeRO-{stage} model states per GPU over {ranks} ranks",
                 "its 18 B/param: 16-bit and fp32 gradients, fp32 master weights, Adam moments")


def gpu_poor_cell(row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """gpu_poor (``src/App.js``, :func:`memlab.studies.formulas.gpu_poor`): its 2-byte weights on a bf16/fp16
    one-token inference row (scored); on one-GPU 16-bit training with Adam (full, LoRA or QLoRA) its states, plus its
    activations where the run has no checkpointing and eager attention (its formula's assumptions): a bound, its
    activations being per layer. ``[gpu-poor]``"""
    from memlab.run.spec import Run
    from memlab.studies.formulas import _gpu_poor_config, gpu_poor

    cfg = _config(row)
    if row.kind == "mfu" or cfg is None:
        return _na("a memory estimator: no MFU" if row.kind == "mfu" else "no config of the model to build")
    c = _gpu_poor_config(hf_of(cfg))
    if _one_token_inference(f):
        if f["weights"] not in ("bf16", "fp16"):
            return _na(f"{f['weights']} inference: its quantised modes are not reimplemented in memlab "
                       "(memlab.studies.formulas.gpu_poor: 16-bit training, LoRA, QLoRA)")
        params = c["vocab"] * c["h"] * 2 + c["layers"] * (4 * c["h"] ** 2 + 3 * c["inter"] * c["h"])
        return _cell(SCORED, 2.0 * params, "its model size: its own parameter formula x 2 B")
    if f["mode"] != "train" or f["world"] > 1 or f["tp"] > 1 or f["cp"] > 1:
        return _na("one GPU, no sharding" if f["mode"] == "train" else "a generation run beyond one token")
    if f["optimizer"] != "adamw" or f["precision"] != "bf16":
        return _na(f"assumes Adam with 2-byte weights, gradients and states, not {f['precision']} with "
                   f"{f['optimizer']}")
    run = Run(hf_of(cfg), f["batch"], f["seq"], "bf16", "eager", finetune=f["finetune"],
              lora_rank=f["lora_rank"] if f["finetune"] != "full" else 0,
              recompute="none" if f["recompute"] == "none" else "full")
    r = gpu_poor(run)
    states = r.states or 0.0
    with_acts = f["recompute"] == "none" and f["attention"] in ("eager", "math")
    return _cell(BOUND, float(states + (r.activations if with_acts else 0.0)),
                 f"its {f['finetune']} states" + (" + per-layer activations" if with_acts else
                                                  " (its activations assume no checkpointing, eager attention)"),
                 "its 650 MB overhead left out")


def _guides_states(n: int, f: dict[str, Any]) -> float:
    """16 B/param sharded as the Playbook's ZeRO stages over ``N_d`` ranks and split over ``t`` tensor ranks:
    ZeRO-1 ``(4 + 12/N_d) N``, ZeRO-2 ``(2 + 14/N_d) N``, ZeRO-3 ``16 N / N_d``. ``[tazi2025]``"""
    d, stage = f["world"], f["zero"]
    per_param = {0: 16.0, 1: 4 + 12 / d, 2: 2 + 14 / d}.get(stage, 16 / d)
    return per_param * n / f["tp"]


def guides_cell(row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """Transformer Math 101 / the Ultra-Scale Playbook: 6N FLOPs per token on an MFU row (scored); the weights at
    their bytes per parameter on a one-token inference row (scored); on full training with Adam, states
    (:func:`_guides_states`) plus Korthikanti et al.'s per-layer activations (t, sp, the context-parallel shard,
    the recompute form; 2-byte values, so a mixed recipe only) as a bound: the head and the loss are not charged.
    ``[anthony2023]`` ``[tazi2025]`` ``[korthikanti2022]``"""
    if row.kind == "mfu":
        return _mfu_of(row, f, 6.0 * _params_of(row), "6N FLOPs per token (training compute C = 6ND)")
    cfg = _config(row)
    if cfg is None:
        return _na("no config of the model")
    if _one_token_inference(f):
        per = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}.get(f["weights"])
        if per is None:
            return _na(f"no {f['weights']} weights among its fp32/16-bit/int8 bytes per parameter")
        return _cell(SCORED, float(per * cfg.param_count()), f"model memory: {per} B/param (inference)")
    if f["mode"] != "train" or f["finetune"] != "full":
        return _na("full training only" if f["mode"] == "train" else "a generation run beyond one token")
    if f["optimizer"] != "adamw" or not (_mixed(f) or f["precision"] == "fp32"):
        return _na(f"assumes AdamW with fp32 states (16 B/param), not {f['precision']} with {f['optimizer']}")
    if f["recompute"] not in ("none", "full", "selective"):
        return _na(f"recompute {f['recompute']!r} (torchtitan's per-op policy recomputes every second matmul "
                   "[torchtitan-ac]) is none of its forms: none, selective (the attention core), full")
    states = _guides_states(cfg.param_count(), f)
    if not _mixed(f):
        return _cell(BOUND, states, "states 16 B/param (its activations are 2-byte: not an fp32 run)")
    form = "full" if f["recompute"] == "full" else (
        "none" if f["recompute"] == "none" and f["attention"] in ("eager", "math") else "selective")
    acts = cfg.n_layers * korthikanti_layer_bytes(f["seq"] // f["cp"], f["batch"], cfg.d_model, cfg.n_heads,
                                                  t=f["tp"], sp=bool(f["sp"]), recompute=form)
    return _cell(BOUND, states + acts, f"states + per-layer activations ({form} form), head and loss not charged")


def torchtitan_cell(row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """torchtitan's MFU formula, ``6 x all parameters + 12 l h q t`` FLOPs per token (torchtitan/utils.py@0413364
    l.111-119), on an MFU row; on a row from llm-foundry, whose dims the row gives (``;l=..;d=..``), the same form
    with h q = d. Its memory estimator is not run on the rows (the reason is in the cell). ``[torchtitan-fsdp]``"""
    if row.kind != "mfu":
        if f.get("zero") and "fsdp_units=torchtitan" in row.memlab_setup:
            return _na("its estimator (scripts/estimate/estimation.py, memlab.studies.titan) traces torchtitan's "
                       "FSDP2 step on fake tensors, minutes of CPU per setup: not run here; its recorded run "
                       "(data/recorded/titan_peer_cpu_trace.json, 1 x 8192, full recompute) is no row's setup")
        return _na("its estimator estimates torchtitan's own training runs; this row is not one")
    cfg = _config(row)
    if cfg is not None:
        per_token = 6.0 * cfg.param_count() + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * f["seq"]
    elif ";" in row.source_flops:
        dims = dict(pair.split("=") for pair in row.source_flops.split(";")[1:])
        per_token = 6.0 * _params_of(row) + 12.0 * int(dims["l"]) * int(dims["d"]) * f["seq"]
    else:
        return _na("the row gives a parameter count but not the layers and width its formula needs")
    cell = _mfu_of(row, f, per_token, "6 x all parameters + 12 l h q t FLOPs per token")
    if row.source_flops and cell["comparison"] == SCORED:  # the source's own MFU definition (same form)
        cell["note"] += ("; the source computed its MFU with this form: a residual near 0 checks the peak and the "
                         "arithmetic, it is not a prediction")
    return cell


TOOL_CELLS = {"memlab": memlab_cell, "accelerate": accelerate_cell, "deepspeed": deepspeed_cell,
              "gpu_poor": gpu_poor_cell, KORTHIKANTI: guides_cell, "torchtitan": torchtitan_cell}
"""Each tool's answer for a row, by name (:data:`TOOLS` order)."""


def _answer(tool: str, row: PublishedRow, f: dict[str, Any]) -> dict[str, Any]:
    """One tool's cell; a setup the tool's own code refuses is not expressible, with its message."""
    from memlab.errors import MemlabError

    try:
        return TOOL_CELLS[tool](row, f)
    except MemlabError as exc:
        return _na(str(exc))


def shootout_rows(rows: tuple[PublishedRow, ...] | None = None) -> tuple[PublishedRow, ...]:
    """The rows the shoot-out compares: those of :data:`SHOOTOUT_KINDS` (the shipped ledger by default)."""
    return tuple(r for r in (published_rows() if rows is None else rows) if r.kind in SHOOTOUT_KINDS)


def published_shootout(rows: tuple[PublishedRow, ...] | None = None,
                       tools: tuple[str, ...] = TOOLS) -> pd.DataFrame:
    """The long table: one line per (published row of :data:`SHOOTOUT_KINDS`, tool) with the row's figure,
    the ``target`` it is compared against (:func:`_target`), what the tool was asked (``claim``), ``predicted``
    (in the row's unit), ``comparison`` (scored / bound / not expressible), ``residual`` (scored cells),
    ``share`` = predicted / target (bound cells) and ``note`` (the reason, for a cell not expressible)."""
    import pandas as pd

    every = published_rows() if rows is None else tuple(rows)
    out = []
    for row in shootout_rows(every):
        f, (target, target_note) = _f(row), _target(row, every)
        scale = MEMORY_UNITS[row.unit] if row.is_memory else 1.0
        for tool in tools:
            c = _answer(tool, row, f)
            pred = None if c["predicted_raw"] is None else c["predicted_raw"] / scale
            out.append({"row_id": row.row_id, "kind": row.kind, "unit": row.unit, "published": row.figure,
                        "target": target, "tool": tool, "comparison": c["comparison"], "claim": c["claim"],
                        "predicted": pred,
                        "residual": (pred - target) / target if c["comparison"] == SCORED else None,
                        "share": pred / target if c["comparison"] == BOUND else None,
                        "note": "; ".join(n for n in (c["note"], target_note if pred is not None else "") if n)})
    return pd.DataFrame(out)


def _kind_summary(tool: str, kind: str, g: pd.DataFrame) -> dict[str, Any]:
    """One (tool, kind of figure) line of :func:`shootout_summary`."""
    scored = g[g["comparison"] == SCORED]
    bound = g[g["comparison"] == BOUND]
    if kind == "all":  # counts only: a median over memory and MFU residuals together would mean nothing
        scored = scored.iloc[:0]
    res = scored["residual"].astype(float)
    worst = scored.loc[res.abs().idxmax()] if len(scored) else None
    return {"tool": tool, "kind": kind, "rows": len(g), "scored": int((g["comparison"] == SCORED).sum()),
            "median_abs_residual": median(res.abs()) if len(scored) else None,
            "worst_residual": None if worst is None else worst["residual"],
            "worst_row": None if worst is None else worst["row_id"], "bound": len(bound),
            "bound_exceeded": int((bound["share"].astype(float) > 1).sum()),
            "not_expressible": int((g["comparison"] == NOT_EXPRESSIBLE).sum())}


def shootout_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per tool and kind of figure: the rows, how many are scored with their median |residual| and worst residual
    (signed, with its row), how many are bounds and how many of those the tool's part exceeds the whole figure,
    and how many the tool cannot express. A last line per tool (kind ``all``) totals the counts."""
    import pandas as pd

    out = []
    for tool in dict.fromkeys(frame["tool"]):
        g = frame[frame["tool"] == tool]
        out += [_kind_summary(tool, kind, gk) for kind, gk in g.groupby("kind", sort=False)]
        out.append(_kind_summary(tool, "all", g))
    return pd.DataFrame(out)


def _cell_text(line: pd.Series) -> str:
    """A cell of :func:`shootout_table`: ``4.12 GiB (+3.1 %)``, ``<= 20.1 GiB (24 % of it)`` or ``n/e: why``."""
    if line["comparison"] == NOT_EXPRESSIBLE:
        return f"n/e: {line['note']}"
    value = f"{line['predicted']:,.3g} {line['unit']}"
    if line["comparison"] == SCORED:
        return f"{value} ({100 * line['residual']:+.1f} %)"
    return f"part {value} ({100 * line['share']:.0f} % of it)"


def shootout_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows x tools: each cell the tool's prediction with its residual (scored), its part with the share of the
    figure it covers (bound), or ``n/e`` with the reason."""
    wide = frame.assign(cell=frame.apply(_cell_text, axis=1)).pivot(index="row_id", columns="tool", values="cell")
    first = frame.drop_duplicates("row_id").set_index("row_id")
    wide = wide.reindex(first.index)[list(dict.fromkeys(frame["tool"]))]
    figure = first.apply(lambda r: f"{r['published']:,.4g} {r['unit']} {r['kind']}", axis=1)
    return wide.assign(published=figure)[["published", *wide.columns]]
