"""The course as a book: executed chapters made fit for a reader, then a static site built by Sphinx + myst-nb.

``make report`` executes every chapter with papermill (:mod:`memlab.course.report`); this module turns the
executed notebooks into the book's sources and builds it with Sphinx, myst-nb (``nb_execution_mode = "off"``: it
renders the papermill outputs as they are) and sphinx-book-theme, offline:

- :func:`chapter_page` makes one executed notebook a page: papermill's parameter cells dropped, long code cells
  folded, the build machine's paths scrubbed, plumbing outputs (a returned ``PosixPath``, a quoted string as a
  cell's last value) dropped or shown as text, citations linked to the references page and each glossary term
  linked at its first use (so the notebooks a learner opens stay plain);
- :func:`write_sources` writes the landing page (course map with each chapter's belief, taken from the chapter),
  the seed articles, the seed-claims table, the glossary, the references (from ``memlab/SOURCES.md``) and the
  build page (status, what each error figure means, provenance), and Sphinx's ``conf.py``;
- :func:`build_site` runs Sphinx and moves the site into the report folder (``OUT/index.html`` is the landing).

Nothing is fetched at build or view time: no MathJax (chapters write formulas as text), no web fonts, analytics,
launch or repository buttons; the theme's icons and scripts are its own bundled files.
"""

from __future__ import annotations

import ast
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memlab.compare.ledger import error_summary
from memlab.course.bibliography import REFERENCES_DOC, link_citations, references_markdown
from memlab.course.chapter import reader_number
from memlab.course.glossary import GLOSSARY_DOC, glossary_markdown, link_first_uses
from memlab.course.pages import scrub, write_atomic

PAGES_DIR = Path(__file__).resolve().parent / "book_pages"
"""The book's hand-written pages (landing text, seed articles, seed claims), shipped with the package."""
SOURCE_DIR = "build/_book"
"""Under the report folder: the book's generated sources (Sphinx's srcdir)."""
SITE_DIR = "build/_site"
"""Under the report folder: Sphinx's output; its ``html/`` is moved into the report folder."""
SOLUTION_CLASS = "memlab-solution"
"""The class of the collapsed ``<details>`` block an exercise's check shows its solution in."""
BUILT_NAMES = ("_static", "_images", "_sources", "_sphinx_design_static", "genindex.html", "search.html",
               "searchindex.js", "objects.inv", ".buildinfo")
"""What a book build writes into the report folder besides its pages (removed before the next build's copy)."""
PARAMETER_TAGS = {"parameters", "injected-parameters"}
FOLD_CODE_LINES = 15
"""A code cell longer than this many lines is folded on its page (``hide-input``: a "show code" toggle above its
outputs); shorter cells, exercise cells among them, are shown as written."""
QUIET_STDERR = (re.compile(r"^USDT:.*SyncActivityProfilerHandler\.cpp:\d+\] profiler_(?:start|stop)$"),)
"""stderr lines dropped from a page: the trace lines torch's profiler library writes straight to the kernel's
stderr on every ``torch.profiler`` start and stop (chapter 08), which say nothing to a reader. Any other stderr
stays on the page (and fails the book's tests)."""
_BELIEF = re.compile(r"\*\*The common beliefs?\.\*\*\s*(.+?)(?:\n\n|$)", re.S)


def _tags(cell: Any) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _plumbing(output: Any) -> Any | None:
    """An output as a reader should see it: None to drop it (a returned path), a markdown paragraph for a quoted
    string that ends a cell, or the output itself."""
    if output.get("output_type") != "execute_result" or set(output.get("data", {})) != {"text/plain"}:
        return output
    text = output["data"]["text/plain"].strip()
    if re.fullmatch(r"(?:Posix|Windows)?Path\('[^']*'\)", text):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return output
    if isinstance(value, str):
        from nbformat.v4 import new_output

        return new_output("display_data", data={"text/markdown": value})
    return output


def _quiet(output: Any) -> Any | None:
    """A stderr stream without the :data:`QUIET_STDERR` lines; None when nothing is left."""
    if output.get("output_type") != "stream" or output.get("name") != "stderr":
        return output
    lines = [ln for ln in output["text"].splitlines(keepends=True)
             if not any(rx.match(ln.rstrip("\n")) for rx in QUIET_STDERR)]
    if not "".join(lines).strip():
        return None
    output["text"] = "".join(lines)
    return output


def _scrub_output(output: Any, paths: Mapping[str, str]) -> Any:
    if "text" in output:
        output["text"] = scrub(output["text"], paths)
    for mime, value in list(output.get("data", {}).items()):
        if isinstance(value, str) and not mime.startswith("image/"):
            output["data"][mime] = scrub(value, paths)
    return output


def chapter_page(nb: Any, paths: Mapping[str, str]) -> Any:
    """One executed chapter notebook as the book's page (see the module docstring); ``nb`` is changed in place."""
    cells = [c for c in nb.cells if not PARAMETER_TAGS & set(_tags(c))]
    for cell in cells:
        if cell.cell_type == "code":
            if cell.source.count("\n") >= FOLD_CODE_LINES and "hide-input" not in _tags(cell):
                cell.setdefault("metadata", {}).setdefault("tags", []).append("hide-input")
            shown = (_plumbing(o) for o in cell.get("outputs", []))
            quiet = (_quiet(o) for o in shown if o is not None)
            cell.outputs = [_scrub_output(o, paths) for o in quiet if o is not None]
            cell.source = scrub(cell.source, paths)
    markdown = [c for c in cells if c.cell_type == "markdown"]
    for cell, text in zip(markdown, link_first_uses([link_citations(c.source) for c in markdown]), strict=True):
        cell.source = text
    nb.cells = cells
    nb.metadata.pop("papermill", None)
    return nb


def write_chapter_page(executed: Path, source_dir: Path, paths: Mapping[str, str]) -> Path:
    """Read an executed notebook, make it a page (:func:`chapter_page`) and write it into the book's sources."""
    import nbformat

    page = chapter_page(nbformat.read(executed, as_version=4), paths)
    source_dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(source_dir / executed.name, nbformat.writes(page))


def first_sentence(text: str) -> str:
    """The first sentence of ``text``: up to the first ``.``, ``!`` or ``?`` (a closing quote kept) that is
    followed by a capital or an opening quote and does not lie inside a quotation."""
    for m in re.finditer(r"[.!?][\"”)]?(?=\s+[A-Z\"“]|\s*$)", text):
        head = text[:m.end()]
        if head.count('"') % 2 == 0 and head.count("“") == head.count("”"):
            return head
    return text


def belief(nb: Any) -> str:
    """The first sentence of a chapter's "**The common belief.**" paragraph, as plain text (citations and
    markdown emphasis removed); "" when the chapter states none."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        m = _BELIEF.search(cell.source)
        if m:
            text = " ".join(line.lstrip("# ").strip() for line in m.group(1).splitlines())
            text = re.sub(r",?\s*\(?`?\[[a-z0-9-]+\]`?\)?(?=[\s,.;:)]|$)", _drop_citation, text)
            text = re.sub(r"\s+([,.;)])", r"\1", re.sub(r"\(\s*\)", "", text)).replace("(, ", "(")
            return first_sentence(text).replace("*", "").strip()
    return ""


def _drop_citation(m: re.Match[str]) -> str:
    """A citation removed from a sentence; the parenthesis it closed (``(seed 000, [seed-000])``) is kept."""
    cited = m.group(0)
    opens, closes = cited.lstrip(", ").startswith("("), cited.endswith(")")
    return ")" if closes and not opens else " (" if opens and not closes else ""


@dataclass(frozen=True)
class BookChapter:
    """A chapter as the book lists it: its number, page name (None when it has no page yet), title, belief."""

    id: str
    name: str
    title: str
    status: str
    belief: str = ""
    page: str | None = None


def _md_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def landing_markdown(chapters: list[BookChapter], solutions: bool) -> str:
    """The landing page: the hand-written introduction with the course map (each chapter's belief) and the
    toctree that gives the book its sidebar and previous/next links: the chapters first, so that the landing's
    "Next" is the chapter "Start here" names, then the seed articles, their claims, the glossary, the references
    and the build page."""
    rows = ["| # | chapter | the belief it checks |", "|---|---|---|"]
    for ch in chapters:
        missing = "(planned)" if ch.status == "planned" else "(not built yet: run its chapter)"
        title = f"{{doc}}`{_md_cell(ch.title)} <{ch.page}>`" if ch.page else f"{_md_cell(ch.title)} {missing}"
        rows.append(f"| {ch.id} | {title} | {_md_cell(ch.belief) or '(not written yet)'} |")
    first = next((ch.page for ch in chapters if ch.page), None)
    start = f"{{doc}}`the first chapter <{first}>`" if first else "the first chapter"
    intro = (PAGES_DIR / "landing.md").read_text(encoding="utf-8")
    intro = intro.replace("{course_map}", "\n".join(rows)).replace("{start_here}", start)
    if solutions:
        intro += "\n```{note}\nThis is the instructor build: every exercise's solution is shown open.\n```\n"
    pages = [*[ch.page for ch in chapters if ch.page], "seeds", "seed-claims", GLOSSARY_DOC, REFERENCES_DOC, "build"]
    toc = ["```{toctree}", ":hidden:", ":maxdepth: 1", "", *pages, "```", ""]
    return intro + "\n" + "\n".join(toc)


def pct(value: float | None) -> str:
    """A fraction as a percentage a reader can trust: exact zero says so, and a tiny error is not rounded to 0."""
    if value is None:
        return "n/a"
    if value == 0:
        return "0 % (exact)"
    if value < 0.0005:
        return f"{reader_number(100 * value)} %" if value >= 5e-7 else "< 0.0001 %"
    return f"{100 * value:.1f} %"


LEDGER_KINDS = {
    "prediction": "prediction vs measurement",
    "bound": "measurement vs an upper bound",
    "contrast": "deliberate contrast",
}
"""What a ledger row's ``kind`` (:data:`memlab.course.chapter.LEDGER_KINDS`) says its two numbers are:
a prediction checked against a measurement (the default), an upper bound a measurement cannot exceed (a roofline),
or two quantities a chapter puts side by side to show that they differ (RSS against live tensor bytes)."""


def _compared(frame: Any) -> str:
    """What a ledger's rows put side by side: components, units and how many experiments."""
    def listed(column: str) -> str:
        if column not in frame.columns:
            return "?"
        values = [str(v) for v in frame[column].dropna().unique()]
        return ", ".join(values[:6]) + (f" and {len(values) - 6} more" if len(values) > 6 else "")

    n = frame["experiment"].nunique() if "experiment" in frame.columns else len(frame)
    return f"{listed('component')} ({listed('unit')}) in {n} experiment{'s' * (n != 1)}"


def _ratio_figure(frame: Any, kind: str) -> str:
    """The median (and range) of measured / predicted over rows with both sides, worded for ``kind``."""
    both = frame.dropna(subset=["predicted", "measured"])
    both = both[both["predicted"] != 0]
    if both.empty:
        return "n/a (no row has both numbers)"
    ratio = (both["measured"] / both["predicted"]).astype(float)
    if kind == "bound":
        return (f"median {ratio.median():.0%} of the bound reached (lowest {ratio.min():.0%}, highest "
                f"{ratio.max():.0%})")
    return f"measured / compared: median {ratio.median():,.2f}× (from {ratio.min():,.2f}× to {ratio.max():,.2f}×)"


def ledger_summary(ledger_csv: Path) -> dict[str, Any] | None:
    """A chapter's ledger summarised; None when there is no ledger.

    ``median_abs_rel_error``, ``max_abs_rel_error`` and ``worst_component`` are over the *prediction* rows only
    (None when there are none, or, for the worst, when every error is zero); ``kinds`` has one entry per kind of
    row present (:data:`LEDGER_KINDS`): what it means, what was compared, how many rows and its figure, worded for
    what the numbers are (an error, the share of a bound reached, a ratio)."""
    import pandas as pd

    if not Path(ledger_csv).exists():
        return None
    frame = pd.read_csv(ledger_csv)
    kinds = frame["kind"].fillna("prediction") if "kind" in frame.columns else pd.Series("prediction", frame.index)
    predictions = frame[kinds == "prediction"]
    summary: dict[str, Any] = {"rows": len(frame), "median_abs_rel_error": None, "max_abs_rel_error": None,
                               "worst_component": None, "compared": _compared(frame), "kinds": []}
    if "rel_error" in frame.columns and not predictions.empty:
        overall = error_summary(predictions, by=None)  # NaN and the inf of a zero measurement left out
        if not overall.empty:
            row = overall.iloc[0]
            summary.update(median_abs_rel_error=float(row["median_abs_rel_error"]),
                           max_abs_rel_error=float(row["max_abs_rel_error"]))
            if row["max_abs_rel_error"] > 0:
                summary["worst_component"] = f"{row['worst_experiment']}: {row['worst_component']}"
    for kind, meaning in LEDGER_KINDS.items():
        rows = frame[kinds == kind]
        if rows.empty:
            continue
        if kind == "prediction":
            if summary["median_abs_rel_error"] is None:
                figure = "n/a (no row has both numbers)"
            elif summary["max_abs_rel_error"] == 0:
                figure = "0 % (exact): every row agrees"
            else:
                figure = (f"median |error| {pct(summary['median_abs_rel_error'])}, largest "
                          f"{pct(summary['max_abs_rel_error'])} ({summary['worst_component']})")
        else:
            figure = _ratio_figure(rows, kind)
        summary["kinds"].append({"kind": kind, "meaning": meaning, "compared": _compared(rows), "rows": len(rows),
                                 "figure": figure})
    return summary


def _comparison_rows(chapters: list[dict[str, Any]]) -> list[str]:
    rows = []
    for ch in chapters:
        for group in (ch.get("ledger") or {}).get("kinds", []):
            rows.append(f"| {_md_cell(ch['title'])} | {_md_cell(group['meaning'])} | {_md_cell(group['compared'])} "
                        f"| {group['rows']:,} | {_md_cell(group['figure'])} |")
    return rows


def build_markdown(index: Mapping[str, Any]) -> str:
    """The build page: how each chapter ran, what its recorded comparisons show (each figure named for what it
    is: a prediction's error, the share of a bound reached, or a deliberate contrast), and the provenance."""
    from memlab.units import fmt_bytes

    prov = index.get("provenance", {})
    lines = ["# About this build", "",
             f"Built {index.get('started', '?')} at scale **{index.get('scale')}** (asked: "
             f"{index.get('scale_requested')}). Each chapter ran in a fresh kernel with papermill; a chapter whose "
             "sources did not change since the last build was reused from it.", "",
             "| # | chapter | how it ran | run time (s) | figures |", "|---|---|---|---:|---:|"]
    status = {"ok": "ran", "cached": "reused from the last build", "failed": "failed (the page shows the error)",
              "not run": "not run in this build", "planned": "planned, not written yet"}
    for ch in index.get("chapters", []):
        run = "" if ch.get("run_time_s") is None else f"{ch['run_time_s']:,.1f}"
        figures = "" if ch["status"] in {"planned", "not run"} else f"{ch.get('figures', 0):,}"
        title = f"{{doc}}`{_md_cell(ch['title'])} <{ch['name']}>`" if ch.get("html") else _md_cell(ch["title"])
        lines.append(f"| {ch['id']} | {title} | {status.get(ch['status'], ch['status'])} | {run} | {figures} |")
    comparisons = _comparison_rows(index.get("chapters", []))
    lines += ["", "## What the chapters compared", "",
              "Each chapter records its numbers side by side in a ledger. Not every row is a prediction checked "
              "against a measurement, so each figure below says what it is: for a **prediction**, the median and "
              "largest |predicted − measured| / measured; for a **bound** (a roofline: no op can beat it), the "
              "median share of the bound the measurement reached; for a **contrast** (two quantities a chapter "
              "puts side by side on purpose to show that they differ), the median ratio of the two.", ""]
    if comparisons:
        lines += ["| chapter | kind | what was compared | rows | figure |", "|---|---|---|---:|---|", *comparisons]
    else:
        lines.append("No chapter recorded a comparison in this build.")
    recorded = prov.get("recorded_gpu_data") or {}
    libraries = ", ".join(f"{k} {v}" for k, v in (prov.get("libraries") or {}).items()) or "unknown"
    dirty = {True: " (uncommitted changes)", False: " (clean)", None: ""}[prov.get("memlab_dirty")]
    host = prov.get("host_memory_bytes")
    rows = [("device", f"{prov.get('device')} ({prov.get('device_kind')})"),
            ("peak figures from", prov.get("peak_source")), ("hardware table revision", prov.get("hardware_table")),
            ("recorded GPU data shown", "; ".join(f"{k} ({v})" for k, v in recorded.items())
             or "none (no page shows results recorded on a GPU)"),
            ("driver", prov.get("driver")), ("torch", f"{prov.get('torch')}"
                                             + (f", CUDA {prov['cuda']}" if prov.get("cuda") else "")),
            ("python", prov.get("python")), ("libraries", libraries), ("OS", prov.get("os")),
            ("host memory (RAM)", fmt_bytes(host) if isinstance(host, int | float) else "unknown"),
            ("memlab commit", f"{prov.get('memlab_commit')}{dirty}"), ("date", prov.get("date")),
            ("seed", prov.get("seed"))]
    lines += ["", "## Provenance", "", "| | |", "|---|---|",
              *[f"| {k} | {_md_cell(v if v is not None else 'unknown')} |" for k, v in rows], ""]
    return "\n".join(lines)


CONF = """\
# Sphinx configuration of the memlab book, generated by memlab.course.book (edit that module, not this file).
project = {project!r}
author = "memlab"
copyright = "memlab authors"
extensions = ["myst_nb", "sphinx_design", "sphinx_togglebutton", "memlab.course.booksearch"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "show"
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
html_theme = "sphinx_book_theme"
html_title = {project!r}
html_static_path = ["_static"]
html_css_files = ["memlab.css"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
mathjax_path = "about:blank"
html_theme_options = {{
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "launch_buttons": {{}},
    "icon_links": [],
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "analytics": {{}},
}}
html_sidebars = {{"**": ["navbar-logo.html", "sbt-sidebar-nav.html"]}}
"""
"""Sphinx's conf.py for the book; MathJax is never loaded (``about:blank``: no page has math), and every theme
option that would reach the network (analytics, launch and repository buttons, icon links) is off."""

CSS = """
/* memlab: the article takes the width the sidebars leave; wide tables scroll inside it; numbers line up. */
.bd-page-width { max-width: 100%; }
.bd-main .bd-content .bd-article-container { max-width: 100%; }
.cell_output table, .bd-article table { display: block; overflow-x: auto; max-width: 100%; }
/* a table fits the page: a cell of words wraps between words and after _ = : / in a long token (its <wbr>), a
   number never wraps; what still does not fit (many columns) scrolls inside the table's own box */
.cell_output td:not(.memlab-text) { white-space: nowrap; }
/* printed lines (a chapter's conclusions) and code wrap inside their box instead of running off its edge */
.cell_output pre, .cell_input pre, div.highlight pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.cell_output td, .cell_output th { font-variant-numeric: tabular-nums; }
details.memlab-solution { border: 1px solid #d0d7de; border-radius: 6px; padding: .3em .8em; margin: .5em 0; }
"""


def write_sources(out: Path, index: Mapping[str, Any], chapters: list[BookChapter], *, solutions: bool) -> Path:
    """Write the book's non-chapter pages, ``conf.py`` and the theme's extra CSS into ``OUT/build/_book``."""
    src = out / SOURCE_DIR
    (src / "_static").mkdir(parents=True, exist_ok=True)
    project = "memlab: memory and compute, predicted and measured" + (" (solutions)" if solutions else "")
    pages = {
        "conf.py": CONF.format(project=project),
        "_static/memlab.css": CSS,
        "index.md": landing_markdown(chapters, solutions),
        "seeds.md": link_citations((PAGES_DIR / "seeds.md").read_text(encoding="utf-8")),
        "seed-claims.md": (PAGES_DIR / "seed-claims.md").read_text(encoding="utf-8"),
        f"{GLOSSARY_DOC}.md": glossary_markdown(),
        f"{REFERENCES_DOC}.md": references_markdown(),
        "build.md": build_markdown(index),
    }
    for name, text in pages.items():
        write_atomic(src / name, text)
    pages_now = {f"{ch.page}.ipynb" for ch in chapters if ch.page}
    for stale in src.glob("*.ipynb"):  # a chapter removed from the course leaves no page behind
        if stale.name not in pages_now:
            stale.unlink()
    return src


@dataclass(frozen=True)
class SiteBuild:
    """A finished book build: Sphinx's exit status, its warnings (text, from its log) and the seconds it took."""

    status: int
    warnings: str
    seconds: float


def build_site(out: Path) -> SiteBuild:
    """Run Sphinx (html) over ``OUT/build/_book`` and move the site into ``OUT`` (``OUT/index.html`` is the
    landing page). Warnings go to ``OUT/build/book-warnings.log``, not the terminal; the previous site's files
    are replaced, the rest of ``OUT`` (``index.json``, ``build/``, ``solutions/``) is kept."""
    from sphinx.cmd.build import build_main

    src, site = out / SOURCE_DIR, out / SITE_DIR
    log = out / "build" / "book-warnings.log"
    shutil.rmtree(site, ignore_errors=True)
    start = time.perf_counter()
    status = build_main(["-b", "html", "-E", "-q", "-Q", "-w", str(log), "-d", str(site / "doctrees"),
                         str(src), str(site / "html")])
    seconds = time.perf_counter() - start
    warnings = log.read_text(encoding="utf-8") if log.exists() else ""
    if status == 0:
        for name in BUILT_NAMES:
            old = out / name
            shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
        for old in out.glob("*.html"):
            old.unlink()
        for item in (site / "html").iterdir():
            shutil.move(str(item), str(out / item.name))
    return SiteBuild(status=status, warnings=warnings, seconds=round(seconds, 2))


def placeholder_index(started: str) -> str:
    """The page ``OUT/index.html`` holds while a build runs (or after one was interrupted)."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>memlab: building</title></head>'
            f"<body><h1>memlab</h1><p>The report is being built (started {started}) or its build was interrupted: "
            "run <code>make report</code> again.</p></body></html>\n")
