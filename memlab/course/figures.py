"""Figure hygiene, measured on the figure itself: do its labels and legends overlap each other or its data?

:func:`figure_overlaps` draws a matplotlib figure and compares window extents (display pixels) of its text
artists (titles, axis labels, annotations and text placed on the axes, legend boxes) with each other and with the
data artists of the same axes (line vertices, bar rectangles, scatter points). :meth:`Chapter.save_figure
<memlab.course.chapter.Chapter.save_figure>` runs it on every figure a chapter saves and writes what it finds to
``out_dir/figure_checks.json``; the report's tests fail on any overlap. Tick labels are left out (matplotlib lays
them out) as are texts that are empty or invisible. Limits: a line is checked at its vertices, not along its
segments (a label between two far-apart points of a line passes), filled areas (``stackplot``,
``fill_between``) and spans are background, not data, and a text drawn wholly inside a bar is that bar's label (a
segment diagram names its blocks inside them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_OVERLAP_PX = 2.0
"""Extents must share more than this many pixels in both directions to count as overlapping (antialiasing and
rounding make touching boxes share one)."""
FIGURE_CHECKS = "figure_checks.json"
"""Written into a chapter's ``out_dir``: figure name -> the overlaps found (empty when none)."""


@dataclass(frozen=True)
class Overlap:
    """Two things drawn over each other: ``first`` and ``second`` describe them (``text 'peak'``, ``legend``,
    ``data of line 'measured'``), ``pixels`` is the shared area in display pixels."""

    first: str
    second: str
    pixels: float

    def __str__(self) -> str:
        return f"{self.first} overlaps {self.second} ({self.pixels:,.0f} px²)"


def _shared(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > MIN_OVERLAP_PX and h > MIN_OVERLAP_PX else 0.0


def _inside(inner: Any, outer: Any) -> bool:
    """Whether box ``inner`` lies within box ``outer`` (to :data:`MIN_OVERLAP_PX`)."""
    tol = MIN_OVERLAP_PX
    return (inner.x0 >= outer.x0 - tol and inner.x1 <= outer.x1 + tol and inner.y0 >= outer.y0 - tol
            and inner.y1 <= outer.y1 + tol)


def _texts(fig: Any, renderer: Any) -> list[tuple[str, Any, Any]]:
    """(description, extent, axes or None) of every visible non-empty text artist and legend of ``fig``."""
    found = []
    seen: set[int] = set()

    def add(artist: Any, what: str, ax: Any) -> None:
        if artist is None or not artist.get_visible() or id(artist) in seen:
            return
        seen.add(id(artist))
        if hasattr(artist, "get_text") and not artist.get_text().strip():
            return
        found.append((what, artist.get_window_extent(renderer), ax))

    if getattr(fig, "_suptitle", None) is not None:
        add(fig._suptitle, f"suptitle {fig._suptitle.get_text()[:30]!r}", None)
    for text in fig.texts:
        add(text, f"figure text {text.get_text()[:30]!r}", None)
    for ax in fig.axes:
        for title in (ax.title, ax._left_title, ax._right_title):
            add(title, f"title {title.get_text()[:30]!r}", ax)
        add(ax.xaxis.label, f"x label {ax.xaxis.label.get_text()[:30]!r}", ax)
        add(ax.yaxis.label, f"y label {ax.yaxis.label.get_text()[:30]!r}", ax)
        for text in ax.texts:
            add(text, f"text {text.get_text()[:30]!r}", ax)
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            found.append(("legend", legend.get_window_extent(renderer), ax))
    for legend in fig.legends:
        found.append(("figure legend", legend.get_window_extent(renderer), None))
    return found


def _data_boxes(ax: Any, renderer: Any) -> list[tuple[str, Any]]:
    """Small display-space boxes covering the data an axes draws: a 3-pixel box per line vertex and scatter
    point, each bar's rectangle (not a span's band, drawn behind the data)."""
    from matplotlib.transforms import Bbox

    boxes = []
    for line in ax.get_lines():
        if not line.get_visible() or (line.get_label().startswith("_child") and len(line.get_xdata()) < 2):
            continue
        xy = ax.transData.transform(line.get_xydata())
        label = line.get_label()
        boxes += [(f"data of line {label[:30]!r}", Bbox.from_bounds(x - 1.5, y - 1.5, 3, 3)) for x, y in xy]
    for patch in ax.patches:  # bars; a span (axvspan: x in data, y in axes coordinates) is a background band
        if (patch.get_visible() and type(patch).__name__ == "Rectangle"
                and patch.get_transform().contains_branch(ax.transData)):
            ext = patch.get_window_extent(renderer)
            if ext.width > 0 and ext.height > 0:
                boxes.append((f"bar {patch.get_label()[:30]!r}", ext))
    for coll in ax.collections:
        if coll.get_visible() and hasattr(coll, "get_offsets") and type(coll).__name__ == "PathCollection":
            for x, y in coll.get_offset_transform().transform(coll.get_offsets()):
                boxes.append(("scatter point", Bbox.from_bounds(x - 1.5, y - 1.5, 3, 3)))
    return boxes


def figure_overlaps(fig: Any) -> list[Overlap]:
    """Every pair of texts (or legends) of ``fig`` drawn over each other, and every text or legend drawn over
    the data of its own axes; empty for a clean figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig, renderer)
    found = []
    for i, (what_a, box_a, _) in enumerate(texts):
        for what_b, box_b, _ in texts[i + 1:]:
            shared = _shared(box_a, box_b)
            if shared:
                found.append(Overlap(what_a, what_b, shared))
    data = {id(ax): _data_boxes(ax, renderer) for ax in fig.axes}
    for what, box, ax in texts:
        if ax is None or what.startswith(("title", "x label", "y label")):
            continue  # titles and axis labels sit outside the plotting area
        hits = [(label, _shared(box, d)) for label, d in data[id(ax)]
                if not (label.startswith("bar ") and _inside(box, d))]  # a bar's own label, drawn inside it
        hits = [(label, px) for label, px in hits if px]
        if hits:
            found.append(Overlap(what, hits[0][0] + (f" and {len(hits) - 1} more" if len(hits) > 1 else ""),
                                 sum(px for _, px in hits)))
    return found
