"""The course's standard figures: predicted beside measured stacked bars, memory timelines, error bars.

Every figure has a title, labelled axes with units, and says where its numbers came from (``source=`` ends
up in the title's second line). Functions return the matplotlib Figure; they never call ``plt.show()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlab.units import byte_unit

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

COMPONENT_COLORS = {
    "params": "#4C72B0",
    "grads": "#DD8452",
    "optimizer": "#55A868",
    "activations": "#C44E52",
    "kv_cache": "#8172B3",
}


def _figure(width: float = 8.0, height: float = 4.5) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    return fig, ax


def stacked_breakdown(table: pd.DataFrame, *, title: str, source: str = "", label_col: str = "experiment") -> Figure:
    """Predicted and measured bars side by side per experiment, each stacked by component.

    ``table`` is a ledger (:func:`memlab.compare.ledger.compare` rows); only the model components (params, grads,
    optimizer, activations, kv_cache) are stacked. The measured bar is hatched.
    """
    t = table[table["component"].isin(list(COMPONENT_COLORS))]
    labels = list(dict.fromkeys(t[label_col]))
    comps = [c for c in COMPONENT_COLORS if c in set(t["component"])]
    peak = max(
        t.groupby(label_col)["predicted"].sum().max(),
        t.groupby(label_col)["measured"].sum().max(),
    )
    unit, size = byte_unit(float(peak))
    fig, ax = _figure(max(6.0, 1.6 * len(labels) + 2), 4.8)
    width = 0.38
    for i, label in enumerate(labels):
        rows = t[t[label_col] == label].set_index("component")
        for j, kind in enumerate(("predicted", "measured")):
            bottom = 0.0
            for comp in comps:
                if comp not in rows.index:
                    continue
                value = float(rows.loc[comp, kind] or 0) / size
                ax.bar(i + (j - 0.5) * width, value, width, bottom=bottom, color=COMPONENT_COLORS[comp],
                       hatch="//" if kind == "measured" else None, edgecolor="white",
                       label=comp if (i == 0 and j == 0) else None)
                bottom += value
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"memory per device ({unit})")
    ax.set_title(title + (f"\n{source}" if source else ""), fontsize=10)
    ax.legend(title="left: predicted, right (hatched): measured", fontsize=8, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1))
    return fig


def phase_timeline(phases: pd.DataFrame, *, title: str, source: str = "") -> Figure:
    """Exact bytes of params, grads, optimizer state and activations at each phase boundary, stacked.

    ``phases`` has a ``phase`` column and one column per component (a runner Measurement's ``phases``).
    """
    comps = [c for c in ("params", "grads", "optimizer", "activations") if c in phases.columns]
    totals = phases[comps].sum(axis=1)
    unit, size = byte_unit(float(totals.max()))
    fig, ax = _figure()
    x = list(range(len(phases)))
    bottom = [0.0] * len(phases)
    for c in comps:
        values = list(phases[c] / size)
        ax.bar(x, values, 0.6, bottom=bottom, color=COMPONENT_COLORS[c], label=c, edgecolor="white")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for xi, total in zip(x, bottom, strict=True):
        ax.text(xi, total, f"{total:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(top=1.15 * max(bottom))  # room for the value labels above the tallest bar, below the title
    ax.set_xticks(x, list(phases["phase"]), rotation=15)
    ax.set_xlabel("after this phase of the first training step")
    ax.set_ylabel(f"bytes held ({unit})")
    ax.set_title(title + (f"\n{source}" if source else ""), fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


def roofline(points: pd.DataFrame, *, peaks: dict[str, float], bandwidth_bytes_per_s: float, title: str,
             bandwidth_label: str = "", source: str = "", extra_bandwidths: dict[str, float] | None = None) -> Figure:
    """Measured points against the roofline :func:`memlab.predict.compute.flops.roofline_bound`, log-log.

    ``points`` has ``arithmetic_intensity`` (FLOP/byte), ``flops_per_s`` and a ``dtype`` column; ``peaks`` maps a
    dtype to its compute roof (FLOP/s). ``extra_bandwidths`` (label -> bytes/s) draws further memory roofs, dotted,
    under the highest peak (e.g. a CPU's DRAM roof beside its cache roof). Axes in FLOP/byte and TFLOP/s.
    """
    import numpy as np

    from memlab.predict.compute.flops import roofline_bound

    fig, ax = _figure(7.5, 4.5)
    lo = max(float(points["arithmetic_intensity"].min()) / 3, 1e-2) if len(points) else 0.1
    hi = max(float(points["arithmetic_intensity"].max()) * 3, 10.0) if len(points) else 1e4
    intensity = np.logspace(np.log10(lo), np.log10(hi), 200)
    for dtype, rows in points.groupby("dtype"):
        ax.scatter(rows["arithmetic_intensity"], rows["flops_per_s"] / 1e12, label=f"{dtype} measured", zorder=3)
        peak = peaks.get(dtype)
        if peak:
            roof = roofline_bound(intensity, peak, bandwidth_bytes_per_s)
            label = f"{dtype} roof" + (f" ({bandwidth_label} bandwidth)" if bandwidth_label else "")
            ax.plot(intensity, roof / 1e12, "--", label=label)
    top = max((p for p in peaks.values() if p), default=None)
    for label, bandwidth in (extra_bandwidths or {}).items():
        if top:
            ax.plot(intensity, roofline_bound(intensity, top, bandwidth) / 1e12, ":", color="0.3",
                    label=f"memory roof ({label})")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte moved)",
           ylabel="throughput (TFLOP/s)")
    ax.set_title(title + (f"\n{source}" if source else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def op_roofline(ops: pd.DataFrame, *, peak_flops_per_s: float, bandwidth_bytes_per_s: float, title: str,
                peak_label: str = "peak", bandwidth_label: str = "bandwidth", source: str = "") -> Figure:
    """The ops of a profiled step on one roofline, log-log: one point per (op, shapes), coloured by ``kind``,
    its area proportional to its share of the step's time (:meth:`memlab.run.op_profile.StepProfile.by_op`).

    ``ops`` needs ``arithmetic_intensity``, ``flops_per_s``, ``self_s`` and ``kind``; FLOP-free ops (copies,
    the embedding gather) have no place on a log x-axis and are left out.
    """
    import numpy as np

    from memlab.predict.compute.flops import roofline_bound

    t = ops[(ops["flops"] > 0) & (ops["self_s"] > 0)]
    fig, ax = _figure(7.5, 4.8)
    lo = max(float(t["arithmetic_intensity"].min()) / 3, 1e-3) if len(t) else 0.01
    hi = max(float(t["arithmetic_intensity"].max()) * 3, 3 * peak_flops_per_s / bandwidth_bytes_per_s)
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(x, roofline_bound(x, peak_flops_per_s, bandwidth_bytes_per_s) / 1e9, "k--",
            label=f"roof: {peak_label}, {bandwidth_label}")
    share = t["self_s"] / t["self_s"].sum() if len(t) else t["self_s"]
    for kind, rows in t.groupby("kind"):
        ax.scatter(rows["arithmetic_intensity"], rows["flops_per_s"] / 1e9, s=20 + 600 * share[rows.index],
                   alpha=0.7, label=kind, zorder=3)
    ax.axvline(peak_flops_per_s / bandwidth_bytes_per_s, color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte, from shapes)",
           ylabel="achieved (GFLOP/s)")
    ax.set_title(title + (f"\n{source}" if source else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def live_stacked(stacked: pd.DataFrame, *, title: str, source: str = "", markers: pd.DataFrame | None = None,
                 capacity_bytes: float | None = None, mark_peak: bool = False) -> Figure:
    """Live bytes op by op, stacked by what allocated them (``memlab.measure.live_bytes.stacked_by_label``'s frame).

    ``markers`` (columns op, label) draws a dotted line where each phase starts, labelled (a label closer than
    4 % of the x range to the previous one is drawn lower, so the two do not overlap); ``capacity_bytes`` a black
    dashed line (no fill colour is black); ``mark_peak`` a red dot and its value at the largest total, which a spike
    a few ops wide among thousands would otherwise hide.
    """
    totals = stacked.sum(axis=1)
    unit, size = byte_unit(float(totals.max()))
    fig, ax = _figure(9.0, 4.8)
    ax.stackplot(stacked.index, *[stacked[c] / size for c in stacked.columns], labels=list(stacked.columns),
                 alpha=0.85)
    peak_at = totals.idxmax() if mark_peak else None
    if markers is not None:
        top = ax.get_ylim()[1]
        span = max(float(stacked.index.max() - stacked.index.min()), 1.0)
        last, level = None, 0
        for op, label in zip(markers["op"], markers["label"], strict=True):
            ax.axvline(op, color="grey", lw=0.5, ls=":")
            level = (level + 1) % 3 if last is not None and op - last < 0.04 * span else 0
            if peak_at is not None and abs(op - peak_at) < 0.04 * span:
                level = max(level, 1)  # below the peak's dot, not on it
            ax.text(op, top * (1 - 0.32 * level), f" {label}", fontsize=8, va="top", rotation=90)
            last = op
    if capacity_bytes is not None:
        ax.axhline(capacity_bytes / size, color="black", lw=1.2, ls="--", label="capacity")
    if peak_at is not None:
        ax.plot([peak_at], [totals[peak_at] / size], "o", color="red", ms=6,
                label=f"peak {totals[peak_at] / size:.2f} {unit}")
    ax.set_xlabel("op number (every tensor op, forward, backward and optimizer)")
    ax.set_ylabel(f"live tensor bytes ({unit})")
    ax.set_title(title + (f"\n{source}" if source else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def shootout_component(frame: pd.DataFrame, component: str, *, title: str, source: str = "") -> Figure:
    """One component of the shoot-out: each tool's signed relative error (%, linear axis, 0 is exact) on every run
    it is scored on, one row per tool (memlab blue, the others red); filled dots for full-size traces, open ones for
    runs measured here.
    ``frame`` is :func:`memlab.studies.calculators.shoot_out`'s table; a tool with no scored run is named with its
    scope ("out of scope", "unavailable"), never drawn as an error. Each scored tool's signed median is a bar."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    part = frame[frame["component"] == component]
    tools = list(dict.fromkeys(frame["tool"]))
    scored = part[part["scope"] == "scored"]
    e_all = scored["rel_error"].astype(float) * 100
    lim = max(5.0, 1.15 * float(e_all.abs().max())) if len(e_all) else 5.0
    fig, ax = plt.subplots(figsize=(8.0, 0.5 * len(tools) + 2.2), layout="constrained")
    names = {"traced": "full-size trace of the HF code", "measured": "small run measured here"}
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        mine = scored[scored["tool"] == tool]
        if mine.empty:
            why = "unavailable" if not part[part["tool"] == tool]["available"].all() else "out of scope"
            ax.text(0.02 * lim, i, why, ha="left", va="center", fontsize=8, color="grey")
            continue
        color = "#4C72B0" if tool.startswith("memlab") else "#C44E52"
        for truth in names:
            e = mine[mine["truth"] == truth]["rel_error"].astype(float) * 100
            if len(e):
                ax.scatter(e, [i] * len(e), s=22, alpha=0.75, edgecolors=color, linewidths=1.0,
                           facecolors=color if truth == "traced" else "none")
                seen.add(truth)
        med = float(mine["rel_error"].astype(float).median() * 100)
        ax.plot([med, med], [i - 0.3, i + 0.3], color="black", lw=1.5)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlim(-lim, lim)
    ax.set_yticks(range(len(tools)), tools)
    ax.set_ylim(len(tools) - 0.4, -0.6)  # first tool on top, room for the last row's label
    ax.set_xlabel("(predicted - truth) / truth, %")
    ax.grid(axis="x", alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color="grey", markerfacecolor="grey" if t == "traced" else "none",
                      label=names[t]) for t in names if t in seen]
    handles.append(Line2D([], [], ls="", marker="|", color="black", markersize=12, label="signed median"))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    fig.suptitle(f"{component}: {title}" + (f"\n{source}" if source else ""), fontsize=10)
    return fig
