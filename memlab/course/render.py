"""The report's provenance and its index page (plain HTML with a little inline CSS, readable offline)."""

from __future__ import annotations

import html
from typing import Any

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#1f2328;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;margin:.6em 0;font-size:.95em} th,td{border:1px solid #d0d7de;padding:4px 9px;
text-align:left;vertical-align:top} th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{font-weight:600;padding:1px 7px;border-radius:9px;color:#fff}
.ok{background:#1a7f37} .cached{background:#0969da} .failed{background:#b3261e} .not-run{background:#6e7781}
.planned{background:#8c959f}
pre{background:#f6f8fa;padding:6px;overflow:auto;margin:.3em 0} .muted{color:#59636e}
"""


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _pct(value: float | None) -> str:
    """A fraction as a percentage a reader can trust: exact zero says so, and a tiny error is not rounded to 0."""
    if value is None:
        return "n/a"
    if value == 0:
        return "0 % (exact)"
    if value < 0.0005:
        return f"{100 * value:.1g} %" if value >= 5e-7 else "< 0.0001 %"
    return f"{100 * value:.1f} %"


def _bytes(n: Any) -> str:
    from memlab.units import fmt_bytes

    return fmt_bytes(n) if isinstance(n, int | float) else "unknown"


def _chapter_row(ch: dict[str, Any]) -> str:
    title = _esc(ch["title"])
    link = f'<a href="{_esc(ch["html"])}">{title}</a>' if ch.get("html") else title
    status = ch["status"]
    badge = f'<span class="status {status.replace(" ", "-")}">{_esc(status)}</span>'
    run = "" if ch.get("run_time_s") is None else f"{ch['run_time_s']:.1f} s"
    error = ""
    if ch.get("error"):
        err = ch["error"]
        error = (f"<details open><summary>{_esc(err['ename'])}: {_esc(err['evalue'])}</summary>"
                 + (f"<pre>{_esc(err['source_head'])}</pre>" if err.get("source_head") else "") + "</details>")
    return (f'<tr class="chapter" data-chapter="{_esc(ch["id"])}" data-status="{_esc(status)}"><td>{_esc(ch["id"])}'
            f'</td><td>{link}{error}</td><td>{badge}</td><td class="num">{run}</td>'
            f'<td class="num">{"" if status in {"planned", "not run"} else ch.get("figures", 0)}</td></tr>')


def _ledger_rows(chapters: list[dict[str, Any]]) -> str:
    rows = []
    for ch in chapters:
        led = ch.get("ledger")
        if not led:
            continue
        exact = led.get("max_abs_rel_error") == 0
        worst = "none: every row agrees exactly" if exact else led.get("worst_component") or "n/a"
        rows.append(f'<tr><td>{_esc(ch["title"])}</td><td>{_esc(led.get("compared", "?"))}</td>'
                    f'<td class="num">{led["rows"]}</td>'
                    f'<td class="num">{_pct(led["median_abs_rel_error"])}</td>'
                    f'<td class="num">{_pct(led["max_abs_rel_error"])}</td>'
                    f'<td>{_esc(worst)}</td></tr>')
    if not rows:
        return '<p class="muted">No chapter recorded predictions next to measurements yet.</p>'
    head = ("<tr><th>chapter</th><th>what was compared</th><th>rows</th><th>median |error|</th><th>max |error|</th>"
            "<th>worst component</th></tr>")
    return f'<table class="ledger">{head}{"".join(rows)}</table>'


def _recorded(prov: dict[str, Any]) -> str:
    shown = prov.get("recorded_gpu_data") or {}
    if not shown:
        return "none (no page shows results recorded on a GPU)"
    return "; ".join(f"{name} ({label})" for name, label in shown.items())


def render_index(index: dict[str, Any]) -> str:
    """The index page: chapters with status and run time, provenance, and the prediction-error summary."""
    prov = index["provenance"]
    dirty = {True: " (dirty: uncommitted changes)", False: " (clean)", None: ""}[prov.get("memlab_dirty")]
    libraries = ", ".join(f"{k} {v}" for k, v in (prov.get("libraries") or {}).items()) or "unknown"
    cuda = f", CUDA {prov['cuda']}" if prov.get("cuda") else ""
    prov_rows = [
        ("device", f"{prov.get('device')} ({prov.get('device_kind')})"),
        ("peak figures from", prov.get("peak_source")),
        ("hardware table revision", prov.get("hardware_table")),
        ("recorded GPU data shown", _recorded(prov)),
        ("driver", prov.get("driver")),
        ("torch", f"{prov.get('torch')}{cuda}"),
        ("python", prov.get("python")),
        ("libraries", libraries),
        ("OS", prov.get("os")),
        ("host memory (RAM)", _bytes(prov.get("host_memory_bytes"))),
        ("memlab commit", f"{prov.get('memlab_commit')}{dirty}"),
        ("date", prov.get("date")),
        ("scale", f"{index['scale']} (asked: {index['scale_requested']}), seed {prov.get('seed')}"),
    ]
    prov_html = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in prov_rows)
    chapters = "".join(_chapter_row(ch) for ch in index["chapters"])
    n_failed = sum(ch["status"] == "failed" for ch in index["chapters"])
    n_planned = sum(ch["status"] == "planned" for ch in index["chapters"])
    verdict = "All chapters ran" if not n_failed else f"{n_failed} chapter(s) failed"
    if n_planned:
        verdict += f" ({n_planned} more planned, not written yet)"
    if not index.get("complete", True):
        verdict = f"The report is being built (started {index.get('started', '?')}) or its build was interrupted"
    total_s = sum(ch.get("run_time_s") or 0 for ch in index["chapters"] if ch["status"] == "ok")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(index['title'])}</title><style>{_CSS}</style></head>
<body>
<h1>{_esc(index['title'])}</h1>
<p class="muted">Predict, run, measure, compare: each chapter puts a memory or compute formula next to a measurement
on this machine. {_esc(verdict)}; executing them took {total_s:.0f} s (cached chapters not counted).</p>
<h2>Chapters</h2>
<table class="chapters"><tr><th>#</th><th>chapter</th><th>status</th><th>run time</th><th>figures</th></tr>
{chapters}</table>
<h2>Prediction errors</h2>
<p class="muted">Per chapter, |predicted &minus; measured| / measured over the rows it recorded, and what those
rows compare.</p>
{_ledger_rows(index['chapters'])}
<h2>Provenance</h2>
<table class="provenance">{prov_html}</table>
</body></html>
"""
