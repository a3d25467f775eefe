"""``make report``: execute every chapter notebook in a fresh kernel, render HTML pages and an index.

``python -m memlab.course.report [--scale auto|ci|full] [--device auto|cpu|cuda] [--force] [--only NN] [--out reports]
[--notebooks notebooks] [--solutions]``

Each ``notebooks/NN_topic.py`` (jupytext percent, the source of truth) is read into a notebook in memory and run
by papermill with ``scale``, ``device``, ``seed`` and ``out_dir = OUT/build/NN_topic`` injected, working directory
``notebooks/``. The executed notebook is rendered to ``OUT/NN_topic.html`` (images embedded, no CDN scripts), and
``OUT/index.html`` + ``OUT/index.json`` list the chapters with status, run time, provenance and a summary of each
chapter's prediction errors (``out_dir/ledger.csv``). A failing chapter does not stop the others; the command exits
1 when any chapter failed. Chapters whose notebook, ``memlab/`` source, recorded data and parameters are unchanged
and whose outputs exist are skipped (``OUT/.cache.json``) unless ``--force``. ``--solutions`` writes the pages with
the exercises' solutions shown into ``OUT/solutions/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from memlab.course.chapter import REPO_ROOT
from memlab.course.exercises import SOLUTIONS_ENV
from memlab.course.provenance import provenance
from memlab.course.render import render_index
from memlab.device import SCALES, device_string, resolve_scale
from memlab.errors import MemlabError

CACHE_VERSION = 1
NOTEBOOK_GLOB = "[0-9][0-9]_*.py"
SOURCE_HEAD_LINES = 4

_OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{% block extra_css %}<style>main{max-width:1100px;margin:0 auto}</style>{% endblock extra_css %}
"""
"""nbconvert's lab template without the scripts it loads from CDNs (require.js, MathJax, mermaid, widgets): the
chapters use plain markdown and PNG figures, which the page carries inline."""


@dataclass(frozen=True)
class ChapterResult:
    """One chapter's line in the index. ``status``: ok | failed | cached | not run; times in seconds."""

    id: str
    name: str
    title: str
    status: str
    run_time_s: float | None = None
    html: str | None = None
    figures: int = 0
    error: dict[str, Any] | None = None
    ledger: dict[str, Any] | None = None
    cache_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_notebooks(notebooks_dir: Path) -> list[Path]:
    """The chapter sources ``NN_*.py`` in ``notebooks_dir``, in chapter order."""
    return sorted(Path(notebooks_dir).glob(NOTEBOOK_GLOB))


def tree_hash(paths: list[Path], root: Path) -> str:
    """sha256 over the relative names and contents of ``paths`` (sorted), so any edit changes it."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def memlab_hash(root: Path = REPO_ROOT) -> str:
    """Hash of ``memlab/**/*.py`` and ``data/recorded/**`` (the code and recorded data chapters depend on)."""
    files = list((root / "memlab").rglob("*.py")) + [p for p in (root / "data" / "recorded").rglob("*") if p.is_file()]
    return tree_hash(files, root)


def cache_key(notebook: Path, code_hash: str, params: dict[str, Any]) -> str:
    """The chapter's cache key: its notebook source, the memlab hash and the injected parameters."""
    payload = {
        "version": CACHE_VERSION,
        "notebook": hashlib.sha256(Path(notebook).read_bytes()).hexdigest(),
        "memlab": code_hash,
        "params": {k: params[k] for k in sorted(params) if k != "out_dir"},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    """The chapter records of a previous run, or {} when there is none or it is unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data.get("chapters", {}) if data.get("version") == CACHE_VERSION else {}


def _title(nb: Any, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def count_figures(nb: Any) -> int:
    """How many PNG/SVG images the executed notebook's outputs hold."""
    return sum(
        1
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if {"image/png", "image/svg+xml", "image/jpeg"} & set(out.get("data", {}))
    )


def ledger_summary(ledger_csv: Path) -> dict[str, Any] | None:
    """Rows, median and max ``|rel_error|`` and the worst component of a chapter's ledger; None when absent."""
    import pandas as pd

    if not Path(ledger_csv).exists():
        return None
    frame = pd.read_csv(ledger_csv)
    summary: dict[str, Any] = {"rows": len(frame), "median_abs_rel_error": None, "max_abs_rel_error": None,
                               "worst_component": None}
    if "rel_error" not in frame.columns:
        return summary
    rel = pd.to_numeric(frame["rel_error"], errors="coerce").abs()
    rel = rel[rel < float("inf")]  # drops NaN and the inf of a zero measurement (its row still counts)
    if rel.empty:
        return summary
    worst = frame.loc[rel.idxmax()]
    summary.update(median_abs_rel_error=float(rel.median()), max_abs_rel_error=float(rel.max()),
                   worst_component=f"{worst.get('experiment', '?')}: {worst.get('component', '?')}")
    return summary


def render_html(nb: Any, html_path: Path, title: str) -> None:
    """Write an executed notebook as a self-contained HTML page (images inline, no CDN scripts)."""
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", embed_images=True,
                            extra_loaders=[jinja2.DictLoader({"memlab_offline.html.j2": _OFFLINE_TEMPLATE})])
    exporter.template_file = "memlab_offline.html.j2"
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    Path(html_path).write_text(body, encoding="utf-8")


@contextmanager
def _solutions_env(on: bool) -> Iterator[None]:
    old = os.environ.get(SOLUTIONS_ENV)
    os.environ[SOLUTIONS_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SOLUTIONS_ENV, None)
        else:
            os.environ[SOLUTIONS_ENV] = old


def _error_of(exc: BaseException) -> dict[str, Any]:
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = getattr(exc, "evalue", None)
    if evalue is None:
        evalue = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    source = getattr(exc, "source", None) or ""
    return {"ename": ename, "evalue": str(evalue), "cell_index": getattr(exc, "cell_index", None),
            "source_head": "\n".join(source.splitlines()[:SOURCE_HEAD_LINES])}


def run_chapter(source: Path, out: Path, params: dict[str, Any], *, progress: bool, timeout_s: int,
                solutions: bool) -> ChapterResult:
    """Execute one chapter in a fresh kernel and render its page; failures are caught and described."""
    import jupytext
    import nbformat
    import papermill

    name = source.stem
    build = Path(params["out_dir"])
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    executed = build / f"{name}.ipynb"
    html_path = out / f"{name}.html"
    html_path.unlink(missing_ok=True)  # a failed run must not leave the previous run's page behind
    title, error = name, None
    start = time.perf_counter()
    try:
        nb = jupytext.read(source)
        title = _title(nb, name)
        with _solutions_env(solutions):
            papermill.execute_notebook(nb, str(executed), parameters=params, cwd=str(source.parent),
                                       progress_bar=progress, request_save_on_cell_execute=False,
                                       execution_timeout=timeout_s)
    except Exception as exc:  # one failing chapter must not stop the others: record it and go on
        error = _error_of(exc)
    run_time_s = time.perf_counter() - start
    html, figures = None, 0
    if executed.exists():
        done = nbformat.read(executed, as_version=4)
        figures = count_figures(done)
        render_html(done, html_path, title)
        html = html_path.name
    return ChapterResult(id=name[:2], name=name, title=title, status="failed" if error else "ok",
                         run_time_s=round(run_time_s, 2), html=html, figures=figures, error=error,
                         ledger=ledger_summary(build / "ledger.csv"))


def _cached(record: dict[str, Any] | None, key: str, out: Path, build: Path) -> bool:
    return bool(record and record.get("cache_key") == key and record.get("status") in {"ok", "cached"}
                and record.get("html") and (out / record["html"]).exists() and build.exists())


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m memlab.course.report", description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=SCALES, default="auto", help="auto: ci on CPU, full on CUDA")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="re-run chapters even when their cache is valid")
    parser.add_argument("--only", action="append", default=[], metavar="NN",
                        help="run only chapter NN (repeat or comma-separate); others keep their last result")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports", help="report folder (default reports/)")
    parser.add_argument("--notebooks", type=Path, default=REPO_ROOT / "notebooks", help="chapter sources")
    parser.add_argument("--solutions", action="store_true", help="render pages with solutions into OUT/solutions/")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell (default 1800)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide papermill's progress")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[list[ChapterResult], dict[str, Any]]:
    """Run (or reuse) every chapter and write the index; returns the chapter results and the index data."""
    import jupytext

    device = device_string(args.device)
    scale = resolve_scale(args.scale, device)
    out = (args.out / "solutions" if args.solutions else args.out).resolve()
    notebooks_dir = args.notebooks.resolve()
    sources = find_notebooks(notebooks_dir)
    if not sources:
        raise MemlabError(f"no chapter notebooks matching {NOTEBOOK_GLOB} in {notebooks_dir}; "
                          "pass --notebooks DIR with NN_topic.py files.")
    only = {part.strip() for item in args.only for part in item.split(",") if part.strip()}
    unknown = only - {s.name[:2] for s in sources}
    if unknown:
        raise MemlabError(f"--only {', '.join(sorted(unknown))}: no such chapter; have "
                          f"{', '.join(s.name[:2] for s in sources)}.")
    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / ".cache.json"
    cache = load_cache(cache_path)
    code_hash = memlab_hash()
    results: list[ChapterResult] = []
    for i, source in enumerate(sources, 1):
        name = source.stem
        build_dir = out / "build" / name
        params = {"scale": scale, "device": device, "seed": args.seed, "out_dir": str(build_dir)}
        key = cache_key(source, code_hash, {**params, "solutions": args.solutions})
        record = cache.get(name)
        head = f"[{i}/{len(sources)}] {name}"
        selected = not only or name[:2] in only
        if _cached(record, key, out, build_dir) and not (args.force and selected):
            result = replace(ChapterResult(**record), status="cached", ledger=ledger_summary(build_dir / "ledger.csv"))
            print(f"{head}: cached (ran in {result.run_time_s} s before; --force re-runs)", flush=True)
        elif not selected:
            try:
                title = _title(jupytext.read(source), name)
            except Exception:  # an unreadable source fails when it is run; here it only lacks a title
                title = name
            result = ChapterResult(id=name[:2], name=name, title=title, status="not run", cache_key=key)
            print(f"{head}: not run (not in --only)", flush=True)
        else:
            print(f"{head}: running at scale {scale} on {device} ...", flush=True)
            result = replace(run_chapter(source, out, params, progress=args.progress, timeout_s=args.timeout,
                                         solutions=args.solutions), cache_key=key)
            line = f"{head}: {result.status} in {result.run_time_s} s"
            if result.error:
                line += f" -- {result.error['ename']}: {result.error['evalue']}"
            print(line, flush=True)
        results.append(result)
        if result.status != "not run":
            cache[name] = result.to_dict()
    cache_path.write_text(json.dumps({"version": CACHE_VERSION, "chapters": cache}, indent=1))
    index = {
        "title": "memlab course report" + (" (solutions)" if args.solutions else ""),
        "ok": not any(r.status == "failed" for r in results),
        "scale": scale,
        "scale_requested": args.scale,
        "solutions": args.solutions,
        "provenance": {**provenance(device), "scale": scale, "seed": args.seed},
        "chapters": [r.to_dict() for r in results],
    }
    (out / "index.json").write_text(json.dumps(index, indent=1))
    (out / "index.html").write_text(render_index(index), encoding="utf-8")
    return results, index


def main(argv: list[str] | None = None) -> int:
    """Build the report; 0 when every chapter ran (or was cached), 1 when one failed, 2 for bad input."""
    args = _parse(argv)
    try:
        results, _ = build(args)
    except MemlabError as err:
        print(f"memlab report: {err}", file=sys.stderr)
        return 2
    failed = [r.name for r in results if r.status == "failed"]
    where = (args.out / "solutions" if args.solutions else args.out).resolve() / "index.html"
    print(f"report: {where} ({len(results) - len(failed)} of {len(results)} chapters without failure)", flush=True)
    if failed:
        print(f"report: failed chapter(s): {', '.join(failed)}; their pages show the error", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
