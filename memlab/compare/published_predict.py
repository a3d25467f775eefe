"""memlab's prediction next to each published GPU figure, the residual, and what explains it.

For a memory row (its unit is bytes) the prediction starts from :func:`memlab.predict.estimate.estimate` of the
row's setup (``memlab_model`` + ``memlab_setup``), one device's tensor peak, and stacks what the device adds
(:mod:`memlab.predict.gpu.device`, every term at its library default or documented range): ``allocated``,
``reserved_low..reserved_high`` and ``device_low..device_high`` (nvidia-smi). ``predicted`` is the matching kind's
figure (its low end for a range: everything but the reserve bound and the range terms' spread) and ``residual``
its residual; ``residual_high`` is the residual of the range's high end.
A setup memlab refuses is predicted with the row's ``memlab_approx`` changes when it has some (said in the note),
and stays refused otherwise. ``predicted_default`` is memlab's answer on its own defaults for the same model and
shape (``Setup(mode, batch, seq, attention='auto')``: fp32, AdamW, no recompute, one device), what a user who
gave nothing else would read. An MFU row gets :func:`memlab.predict.compute.flops.mfu` of the row's published
throughput (memlab's FLOPs per token over the device's dense bf16 peak). A throughput or time row is not
predicted (memlab counts FLOPs and bytes, not kernel time); where memlab knows the model and the GPU it shows
the MFU that throughput implies. The residual is ``(predicted - published) / published``. The notes come from
:data:`KIND_NOTES` and :data:`SETUP_NOTES`; nothing is tuned to a row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from statistics import median
from typing import TYPE_CHECKING, Any

from memlab.compare.published import KIND_WORDS, MEMORY_UNITS, PublishedRow, parse_setup, published_rows
from memlab.errors import MemlabError
from memlab.predict.compute.flops import mfu
from memlab.predict.estimate import MemoryBreakdown, estimate
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

if TYPE_CHECKING:
    import pandas as pd

KIND_NOTES = {
    "reserved": "published is the caching allocator's peak reserved; memlab's range runs from its allocated peak "
                "(tensors + cuBLAS workspaces) to that plus the formula's reserve bound (memlab.predict.gpu.device)",
    "nvidia_smi_used": "published is nvidia-smi's used memory; memlab's range is reserved (as for a reserved row) + "
                       "the CUDA context's documented range (+ NCCL buffers)",
    "active": "published is the peak active bytes; memlab predicts the peak allocated",
    "max_allocated": "published is torch.cuda.max_memory_allocated: memlab's tensor peak + cuBLAS workspaces",
    "other": "the source does not say which peak it reports (allocated, active or reserved)",
}
"""What the published figure measures against memlab's prediction, by :data:`memlab.compare.published.KINDS`."""

SETUP_NOTES = (
    (lambda r: "torch.compile" in r.other_setup, "torch.compile is not modelled: memlab's figure is the eager step"),
    (lambda r: "Float8" in r.other_setup or "float8" in r.other_setup,
     "Float8 linears (torchao) are not modelled: memlab's figure is the bf16 step"),
    (lambda r: "optimizer in backward" in r.optimizer,
     "the optimizer runs in backward and frees each gradient there; memlab holds every gradient until the step"),
    (lambda r: "CPU offload" in r.parallel, "states offloaded to the CPU: memlab counts them as host bytes"),
    (lambda r: "not stated" in (r.batch + r.seq), "the source does not state the batch or the sequence length"),
    (lambda r: r.source_id == "torchtune-readme-2024-10" and r.gpu in ("RTX 4090", "RTX A6000"),
     "the README gives one recipe and setup on a 4090 and an A6000 with different peaks (full 18.9 vs 37.4 GiB, "
     "LoRA 16.2 vs 30.3 GiB): the runs differ in something the README does not state, and memlab predicts one "
     "figure for both"),
)
"""(condition on the row, note) pairs: setup differences between the published run and memlab's figure."""


@dataclass(frozen=True)
class PublishedPrediction:
    """memlab's figure for one published row. ``predicted`` and ``predicted_default`` are in the row's ``unit``;
    ``residual = (predicted - published) / published``; ``status`` is predicted, approximated (predicted with the
    row's memlab_approx changes, or on the closest config its memlab_gap names), refused, not expressible or not
    predicted; ``memlab_figure`` is a figure memlab
    gives that is not the published quantity (the MFU a throughput implies)."""

    row_id: str
    kind: str
    unit: str
    published: float
    predicted: float | None
    predicted_default: float | None
    residual: float | None
    status: str
    memlab_figure: str
    note: str
    allocated: float | None = None
    """memlab's max_memory_allocated: the tensor peak + cuBLAS workspaces (+ DDP buckets), the row's unit."""
    reserved_low: float | None = None
    reserved_high: float | None = None
    """max_memory_reserved: allocated up to allocated + the formula's reserve bound."""
    device_low: float | None = None
    device_high: float | None = None
    """Device-used (nvidia-smi): reserved + the CUDA context (+ NCCL buffers), their documented ranges."""
    residual_high: float | None = None
    """The residual against the high end of the matching kind's range (equal to ``residual`` for a point)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


def _seq(row: PublishedRow) -> int | None:
    """The setup's sequence length (None when the row has no memlab setup)."""
    value = row.setup_fields.get("seq")
    return value if isinstance(value, int) else None


def _notes(row: PublishedRow, extra: list[str]) -> str:
    """The kind's note, the row's setup notes and ``extra``, joined."""
    parts = ([KIND_NOTES[row.kind]] if row.is_memory and row.kind in KIND_NOTES else []) + extra
    parts += [note for test, note in SETUP_NOTES if test(row)]
    return "; ".join(parts)


def _estimate(config: TransformerConfig, row: PublishedRow) -> tuple[MemoryBreakdown, str, Setup]:
    """The estimate of the row's setup, or of its memlab_approx version when memlab refuses it as given (the
    second element says which: '' or the refusal and the changes; the third is the setup estimated)."""
    fields = row.setup_fields
    try:
        setup = Setup(**fields)
        return estimate(config, setup), "", setup
    except MemlabError as exc:
        if not row.memlab_approx:
            raise
        changed = {**fields, **parse_setup(row.memlab_approx)}
        how = f"memlab refuses the setup as given ({exc}); predicted with {row.memlab_approx} instead"
        setup = Setup(**changed)
        return estimate(config, setup), how, setup


DEVICE_KINDS = {"reserved": ("reserved_low", "reserved_high"), "nvidia_smi_used": ("device_low", "device_high")}
"""The kinds whose matching prediction is a range (the others are matched with ``allocated``, a point)."""


def _arch_key(row: PublishedRow) -> str:
    """A memlab GPU key standing for the row's architecture where it sets a default (cuBLAS's workspace on sm90):
    the row's ``memlab_gpu``, a Hopper key when the row's GPU text names one, else '' (the default size)."""
    if row.memlab_gpu:
        return row.memlab_gpu
    return "h100-sxm" if any(w in row.gpu for w in ("H100", "H200", "GH200")) else ""


def device_figures(bd: MemoryBreakdown, setup: Setup, row: PublishedRow) -> dict[str, float]:
    """Allocated, reserved (range) and device-used (range) of the row's estimate, in the row's unit: the terms of
    :mod:`memlab.predict.gpu.device` at their library defaults and documented ranges, nothing fitted to the row."""
    from memlab.predict.gpu.device import DeviceOverheads, device_peaks, reserve_bound, terms

    extra = terms(_arch_key(row), setup, DeviceOverheads(), bd.grads_bytes)
    bound = reserve_bound(bd.peak_bytes, bd.params_bytes + bd.optimizer_bytes)
    p = device_peaks(bd.peak_bytes, (0, bound), 1, extra, "bound")
    unit = MEMORY_UNITS[row.unit]
    return {"allocated": p.allocated_bytes / unit, "reserved_low": p.reserved_low_bytes / unit,
            "reserved_high": p.reserved_bytes / unit, "device_low": p.device_low_bytes / unit,
            "device_high": p.device_high_bytes / unit}


def _default(config: TransformerConfig, row: PublishedRow) -> float | None:
    """memlab's peak on its own defaults for the row's model and shape, in the row's unit (None if refused)."""
    f = row.setup_fields
    try:
        bd = estimate(config, Setup(mode=f.get("mode", "train"), batch=f.get("batch", 1), seq=f.get("seq", 1024),
                                    attention="auto"))
    except MemlabError:
        return None
    return bd.peak_bytes / MEMORY_UNITS[row.unit]


def _memory(row: PublishedRow) -> PublishedPrediction:
    """A memory row: the estimate's peak against the published bytes."""
    base = {"row_id": row.row_id, "kind": row.kind, "unit": row.unit, "published": row.figure, "memlab_figure": ""}
    if not row.memlab_model:
        return PublishedPrediction(**base, predicted=None, predicted_default=None, residual=None,
                                   status="not expressible", note=row.memlab_gap)
    config = preset(row.memlab_model)
    try:
        bd, how, setup = _estimate(config, row)
    except MemlabError as exc:
        return PublishedPrediction(**base, predicted=None, predicted_default=_default(config, row), residual=None,
                                   status="refused", note=str(exc))
    dev = device_figures(bd, setup, row)
    low, high = DEVICE_KINDS.get(row.kind, ("allocated", "allocated"))
    extra = [e for e in (row.memlab_gap, how) if e]  # memlab_gap beside a model: the closest config and its gaps
    if bd.paged_bytes:
        extra.append(f"paged optimizer states ({bd.paged_bytes / 2**30:.2f} GiB) live in CUDA managed memory, "
                     "outside torch's allocator and memlab's peak")
    return PublishedPrediction(**base, predicted=dev[low], predicted_default=_default(config, row),
                               residual=(dev[low] - row.figure) / row.figure,
                               status="approximated" if how or row.memlab_gap else "predicted",
                               note=_notes(row, extra), **dev, residual_high=(dev[high] - row.figure) / row.figure)


def _source_mfu(row: PublishedRow, model: TransformerConfig | float, tps: float, peak: float | None) -> str:
    """The MFU the source's own FLOPs formula (``source_flops``) gives with memlab's peak, as a note: on memlab's
    config (torchtitan's 6 x all parameters + 12*l*h*q*t) or on the row's parameter count and the source's dims
    (llm-foundry's 6N + 12*l*d*T)."""
    formula, *dims = row.source_flops.split(";") if row.source_flops else ("",)
    seq = _seq(row) or 0
    if peak is None or not formula:
        return ""
    if formula == "6*all_params+12*l*h*q*t" and isinstance(model, TransformerConfig):
        per_token = 6 * model.param_count() + 12 * model.n_layers * model.n_heads * model.head_dim * seq
        said = "6 x all parameters, embeddings included, + 12*l*h*q*t, on memlab's config"
    elif formula == "6*N+12*l*d*T" and not isinstance(model, TransformerConfig):
        d = dict(pair.split("=") for pair in dims)
        attention = 12 * int(d["l"]) * int(d["d"]) * seq
        per_token = 6 * model + attention
        said = f"6N + 12*l*d*T with l = {d['l']}, d = {d['d']}: attention adds {attention / (6 * model):.1%} to 6N"
    else:
        return ""
    return f"the source's formula ({said}) with memlab's peak gives {100 * tps * per_token / peak:.1f} %"


def _throughput(row: PublishedRow) -> PublishedPrediction:
    """An MFU row (predicted from its throughput) or a throughput / time row (not predicted; the implied MFU)."""
    base = {"row_id": row.row_id, "kind": row.kind, "unit": row.unit, "published": row.figure,
            "predicted_default": None}
    if not (row.memlab_model and row.memlab_gpu and row.tokens_per_s_per_device):
        why = row.memlab_gap or ("no memlab GPU entry for " + row.gpu if row.memlab_model else "no memlab model")
        return PublishedPrediction(**base, predicted=None, residual=None, status="not predicted", memlab_figure="",
                                   note=f"memlab predicts FLOPs and bytes, not kernel time; {why}")
    params = row.memlab_model.startswith("params:")
    config = float(row.memlab_model[7:]) if params else preset(row.memlab_model)  # params:N: 6N, no attention
    tps = float(row.tokens_per_s_per_device)
    fields = row.setup_fields
    try:
        tuned = Setup(**fields) if fields.get("finetune", "full") != "full" else None  # LoRA: its step's FLOPs
        r = mfu(config, tps, accelerator=row.memlab_gpu, seq=_seq(row), recompute=fields.get("recompute", "none"),
                dtype="bf16", finetune=tuned)
    except MemlabError as exc:
        return PublishedPrediction(**base, predicted=None, residual=None, status="refused", memlab_figure="",
                                   note=str(exc))
    if r.mfu is None:
        return PublishedPrediction(**base, predicted=None, residual=None, status="not predicted", memlab_figure="",
                                   note=str(r.reason))
    formula = f"memlab: {r.formula}, {r.peak_flops_per_s / 1e12:,.0f} TFLOP/s dense bf16 peak of {r.accelerator}"
    if row.kind == "mfu":
        predicted = 100 * r.mfu
        extra = [e for e in (formula, _source_mfu(row, config, tps, r.peak_flops_per_s)) if e]
        return PublishedPrediction(**base, predicted=predicted, residual=(predicted - row.figure) / row.figure,
                                   status="predicted", memlab_figure="", note="; ".join(extra))
    return PublishedPrediction(**base, predicted=None, residual=None, status="not predicted",
                               memlab_figure=f"implied MFU {100 * r.mfu:.1f} %",
                               note=f"memlab predicts FLOPs, not kernel time: this throughput is "
                                    f"{100 * r.mfu:.1f} % of the dense peak ({formula})")


def predict_row(row: PublishedRow) -> PublishedPrediction:
    """memlab's figure for one published row (never raises for a setup memlab cannot express: the status and the
    note say why)."""
    if row.is_memory:
        return _memory(row)
    return _throughput(row)


@lru_cache(maxsize=8)
def _predicted(rows: tuple[PublishedRow, ...]) -> tuple[PublishedPrediction, ...]:
    return tuple(predict_row(r) for r in rows)


def predict_published(rows: tuple[PublishedRow, ...] | None = None) -> tuple[PublishedPrediction, ...]:
    """:func:`predict_row` of every row (the shipped ledger by default; cached: rows and predictions are frozen)."""
    return _predicted(published_rows() if rows is None else tuple(rows))


def published_frame(rows: tuple[PublishedRow, ...] | None = None) -> pd.DataFrame:
    """One row per published figure: its provenance and setup columns, then memlab's prediction columns."""
    import pandas as pd

    rows = published_rows() if rows is None else rows
    preds = {p.row_id: p.to_dict() for p in predict_published(rows)}
    return pd.DataFrame([{**r.to_dict(), **preds[r.row_id]} for r in rows])


def residual_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per kind of figure: rows, rows predicted, median |residual| and the worst residual (signed) with its row."""
    import pandas as pd

    out = []
    for kind, group in frame.groupby("kind", sort=False):
        done = group[group["residual"].notna()]
        worst = done.loc[done["residual"].abs().idxmax()] if len(done) else None
        row = {"kind": kind, "rows": len(group), "predicted": len(done),
               "median_abs_residual": median(done["residual"].abs()) if len(done) else None,
               "worst_residual": None if worst is None else worst["residual"],
               "worst_row": None if worst is None else worst["row_id"]}
        if "residual_high" in group and kind in DEVICE_KINDS and len(done):
            high = done["residual_high"]
            row |= {"median_abs_residual_high": median(high.abs()),
                    "within_range": int(((done["residual"] <= 0) & (high >= 0)).sum())}
        out.append(row)
    return pd.DataFrame(out)


def _setup_text(row: PublishedRow) -> str:
    """The row's setup in one line, leaving out what the source does not state."""
    shape = f"batch {row.batch} x seq {row.seq}" if row.batch and row.seq else (f"batch {row.batch}" if row.batch
                                                                                 else "")
    parts = (row.model, row.precision, row.optimizer, shape, f"checkpointing: {row.checkpointing}"
             if row.checkpointing else "", row.attention, row.parallel, row.finetune, row.other_setup)
    return "; ".join(p for p in parts if p and "not stated" not in p)


def _figure_text(value: float | None, unit: str) -> str:
    """A figure with its unit, to three significant figures (``-`` when absent)."""
    if value is None or value != value:
        return "-"
    return f"{value:,.3g} {unit}" if abs(value) < 1000 else f"{value:,.0f} {unit}"


def _device_text(p: PublishedPrediction, unit: str) -> str:
    """memlab's three device figures of a memory row (ranges where a term is one); '-' for other rows."""
    if p.allocated is None:
        return "-"

    def span(lo: float | None, hi: float | None) -> str:
        return _figure_text(lo, unit) if lo == hi else f"{_figure_text(lo, unit)} .. {_figure_text(hi, unit)}"

    return (f"{_figure_text(p.allocated, unit)} / {span(p.reserved_low, p.reserved_high)} / "
            f"{span(p.device_low, p.device_high)}")


def _short_url(url: str) -> str:
    """``https://github.com/OWNER/REPO/blob/COMMIT/PATH`` as ``OWNER/REPO@COMMIT7: PATH`` (it wraps in a table)."""
    head, sep, tail = url.partition("/blob/")
    if not sep or "/" not in tail:
        return url
    commit, _, path = tail.partition("/")
    return f"{head.removeprefix('https://github.com/')}@{commit[:7]}: {path}"


def chapter_frame(chapter: str) -> pd.DataFrame:
    """The published rows that bear on chapter ``chapter`` ("07") as a reader's table: the source and where in it,
    the hardware, what the number measures, the setup, the published figure, memlab's figure for that setup, the
    residual and what explains it."""
    import pandas as pd

    rows = published_rows(chapter=chapter)
    if not rows:
        raise MemlabError(f"no published row bears on chapter {chapter}: tag rows in data/published/ledger.csv")
    preds = {p.row_id: p for p in predict_published(rows)}
    out = []
    for r in rows:
        p = preds[r.row_id]
        memlab = p.memlab_figure or _figure_text(p.predicted, r.unit) if p.predicted is not None or p.memlab_figure \
            else p.status
        out.append({"row": r.row_id, "source (published)": r.source, "where": f"{r.locator}; {_short_url(r.url)}",
                    "hardware": f"{r.devices} x {r.gpu}" if r.devices else r.gpu,
                    "what the number is": f"{KIND_WORDS[r.kind]} ({r.unit})", "setup": _setup_text(r),
                    "published": _figure_text(r.figure, r.unit), "memlab": memlab,
                    "memlab allocated / reserved / device-used": _device_text(p, r.unit),
                    "residual": "-" if p.residual is None else f"{100 * p.residual:+.1f} %", "why": p.note})
    return pd.DataFrame(out)
