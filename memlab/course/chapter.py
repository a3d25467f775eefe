"""What every chapter notebook needs at its top: resolved parameters, a seeded run and a place for its outputs.

A chapter starts with ``ch = chapter(scale, device, seed, out_dir)`` using its tagged ``parameters`` cell (papermill
injects values when ``make report`` runs it). ``scale="auto"`` means ``ci`` (small, seconds) on a CPU and ``full``
(real size) on CUDA; the same notebook code runs both. The :class:`Chapter` it returns saves figures and tables,
appends prediction-vs-measurement rows to the chapter's ledger (which the report summarises), says in one sentence
what a CPU cannot show, loads results recorded on a real GPU from ``data/recorded/`` with their label, and shows the
published GPU measurements that bear on the chapter (``ch.published("08")``, from ``data/published/ledger.csv``) next to
memlab's prediction for each setup.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import random
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memlab.device import device_string, device_type, resolve_scale
from memlab.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDED_DIR = REPO_ROOT / "data" / "recorded"
"""Results recorded on real GPUs: ``NAME.csv`` plus ``NAME.json`` (provenance), or ``NAME.json`` with ``rows``."""
RECORDED_SHOWN = "recorded_shown.json"
"""Written into ``out_dir`` by :meth:`Chapter.recorded` when GPU data is loaded: the report's provenance says which
recorded results a page shows."""
QUIET_WARNINGS = (r"IProgress not found",)
"""Warning messages (regexes) silenced in a chapter's kernel: tqdm.auto's notice that ipywidgets is absent (the
text bar it falls back to is fine); nothing a reader needs to act on."""
LEDGER_KINDS = ("prediction", "bound", "contrast")
"""What a ledger row's two numbers are: a prediction and a measurement, an upper bound and a measurement, or two
quantities contrasted on purpose (:meth:`Chapter.record_ledger`)."""
SEED_CLAIMS_COLUMNS = ("claim", "verdict")
"""Columns every seed-claims table has (:meth:`Chapter.seed_claims`), beside the seed and the number."""


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's random generators (torch only when it is installed)."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Recorded:
    """Results recorded on a real GPU, with where they came from. Shown as such, never regenerated on a CPU."""

    name: str
    frame: Any  # pandas.DataFrame
    provenance: dict[str, Any]

    @property
    def label(self) -> str:
        """One line naming the GPU, driver, torch version and date the rows were recorded with."""
        p = self.provenance
        parts = [f"recorded on {p.get('gpu', 'an unnamed GPU')}"]
        commit = p.get("memlab_commit") or p.get("commit")
        parts += [f"{key} {p[key]}" for key in ("driver", "torch") if p.get(key)]
        parts += [f"memlab {str(commit)[:10]}"] if commit else []
        parts += [f"date {p['date']}"] if p.get("date") else []
        return ", ".join(parts)

    def _repr_html_(self) -> str:
        import html

        head = f"<p><b>{html.escape(self.name)}</b> ({html.escape(self.label)})</p>"
        return head + reader_html(self.frame, index=False)


def load_recorded(name: str, directory: Path | str = RECORDED_DIR) -> Recorded | None:
    """Load ``directory/NAME.csv`` (+ ``NAME.json`` provenance) or ``NAME.json`` with ``rows``; None when absent.

    The provenance must name at least the ``gpu``; ``driver``, ``torch``, ``commit`` and ``date`` are shown when
    present. A file without provenance is refused: an unlabelled GPU number would read like a measurement here.
    """
    import pandas as pd

    directory = Path(directory)
    csv_path, json_path = directory / f"{name}.csv", directory / f"{name}.json"
    if not csv_path.exists() and not json_path.exists():
        return None
    meta: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {}
    provenance = meta.get("provenance", {k: v for k, v in meta.items() if k != "rows"})
    if not provenance.get("gpu"):
        raise ConfigError(f"recorded results {name!r} in {directory} carry no provenance: add {json_path.name} "
                          "with at least 'gpu' (and 'driver', 'torch', 'commit', 'date').")
    frame = pd.read_csv(csv_path) if csv_path.exists() else pd.DataFrame(meta.get("rows", []))
    return Recorded(name=name, frame=frame, provenance=provenance)


@dataclass(frozen=True)
class SeedClaims:
    """A chapter's answers to its rows of SEED-CLAIMS.md; shown with every cell whole (a number is never cut)."""

    frame: Any  # pandas.DataFrame

    def _repr_html_(self) -> str:
        return reader_html(self.frame, index=False)


@dataclass(frozen=True)
class PublishedEvidence:
    """Published GPU measurements that bear on a chapter, next to memlab's prediction for each setup
    (:func:`memlab.compare.published_predict.chapter_frame`). Shown labelled as published: read at their sources,
    never measured by this project."""

    chapter: str
    frame: Any  # pandas.DataFrame

    @property
    def label(self) -> str:
        """The heading a page shows above the table."""
        return (f"Published GPU measurements bearing on chapter {self.chapter} ({len(self.frame)} figures from "
                f"{self.frame['source (published)'].nunique()} sources, read at the "
                "sources cited in data/published/ledger.csv; not measured by this project). memlab: its prediction "
                "for the row's setup (one device's peak allocated bytes, or the MFU of the published throughput); "
                "residual = (memlab - published) / published.")

    shown_rows: int = 40
    """At most this many rows on a page (pandas would cut a longer table with "..." rows); the rest is one
    command away, which the page names."""

    def _repr_html_(self) -> str:
        import html

        more = len(self.frame) - self.shown_rows
        rest = (f"<p>{more} more published rows bear on this chapter: <code>memlab ledger --published --chapter "
                f"{self.chapter}</code> prints every one.</p>") if more > 0 else ""
        return (f"<p><b>{html.escape(self.label)}</b></p>" + reader_html(self.frame.head(self.shown_rows), index=False)
                + rest)


@dataclass(frozen=True)
class CpuNote:
    """One sentence saying what a chapter cannot show on a CPU; shown as markdown when it ends a notebook cell."""

    text: str

    def __str__(self) -> str:
        return f"On this CPU: {self.text}"

    def _repr_markdown_(self) -> str:
        return f"> **On this CPU:** {self.text}"


@dataclass(frozen=True)
class Chapter:
    """A chapter's resolved parameters and its output folder (figures, tables, ``ledger.csv``)."""

    scale: str  # "ci" | "full" (resolved)
    device: str  # "cpu" | "cuda" | "cuda:N" (resolved)
    seed: int
    out_dir: Path

    @property
    def on_cpu(self) -> bool:
        return self.device_type == "cpu"

    @property
    def device_type(self) -> str:
        """``"cpu"`` or ``"cuda"``: the type of the chapter's device (:func:`memlab.device.device_type`), for calls
        that take a device type."""
        return device_type(self.device)

    @property
    def ledger_path(self) -> Path:
        return self.out_dir / "ledger.csv"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "out_dir": str(self.out_dir)}

    def _repr_markdown_(self) -> str:
        """What the chapter runs at, for the page; where its files go is logged (:func:`chapter`), not shown: a
        build folder says nothing to a reader of the book."""
        return f"Running at scale **{self.scale}** on **{self.device}**, seed {self.seed}."

    def save_figure(self, fig: Any, name: str) -> Path:
        """Save a matplotlib figure as ``out_dir/NAME.png`` (150 dpi) and return the path.

        Inside a notebook the saved PNG is also shown, once (a pyplot figure is closed so the inline backend does
        not show it again): every saved figure appears on the chapter's page, including figures built without
        pyplot, which the inline backend would not render. Its labels and legends are checked against each other
        and its data (:func:`memlab.course.figures.figure_overlaps`); what overlaps is written to
        ``out_dir/figure_checks.json`` (the report's tests fail on any).
        """
        from memlab.course.figures import FIGURE_CHECKS, figure_overlaps

        path = self.out_dir / f"{_safe(name)}.png"
        checks_path = self.out_dir / FIGURE_CHECKS
        checks = json.loads(checks_path.read_text()) if checks_path.exists() else {}
        checks[path.stem] = [str(o) for o in figure_overlaps(fig)]
        checks_path.write_text(json.dumps(checks, indent=1))
        fig.savefig(path, dpi=150, bbox_inches="tight")
        if _in_notebook():
            import matplotlib.pyplot as plt
            from IPython.display import Image, display

            display(Image(filename=str(path)))
            plt.close(fig)
        return path

    def save_table(self, df: Any, name: str) -> Path:
        """Save a DataFrame as ``out_dir/NAME.csv`` and return the path."""
        path = self.out_dir / f"{_safe(name)}.csv"
        df.to_csv(path, index=False)
        return path

    def record_ledger(self, df: Any) -> Path:
        """Append prediction-vs-measurement rows to ``out_dir/ledger.csv`` and return its path.

        ``df`` needs ``experiment``, ``component``, ``unit``, ``predicted`` and ``measured``; ``abs_error`` and
        ``rel_error`` are computed when absent, by :func:`memlab.compare.ledger.with_errors` (the one ledger schema,
        :data:`memlab.compare.ledger.COLUMNS`, and the one relative error). A row recorded again for the same
        (experiment, component, unit) replaces the earlier one, so re-running a cell does not double count.
        An optional ``kind`` column says what the two numbers are (:data:`LEDGER_KINDS`): ``prediction`` (the
        default), ``bound`` (``predicted`` is an upper bound, a roofline) or ``contrast`` (two quantities put side
        by side on purpose); the report words each kind's figure for what it is.
        """
        import pandas as pd

        from memlab.compare.ledger import REQUIRED, with_errors

        rows = pd.DataFrame(df)
        missing = [c for c in REQUIRED if c not in rows.columns]
        if missing:
            raise ConfigError(f"ledger rows lack column(s) {', '.join(missing)}; need {', '.join(REQUIRED)}.")
        kinds = set(rows["kind"].dropna()) if "kind" in rows.columns else set()
        if kinds - set(LEDGER_KINDS):
            raise ConfigError(f"ledger kind(s) {', '.join(sorted(map(str, kinds - set(LEDGER_KINDS))))} unknown; "
                              f"use {', '.join(LEDGER_KINDS)}.")
        rows = with_errors(rows)
        if self.ledger_path.exists():
            rows = pd.concat([pd.read_csv(self.ledger_path), rows], ignore_index=True)
        rows = rows.drop_duplicates(subset=["experiment", "component", "unit"], keep="last")
        rows.to_csv(self.ledger_path, index=False)
        return self.ledger_path

    def seed_claims(self, rows: Any, columns: list[str] | None = None) -> SeedClaims:
        """The chapter's rows of SEED-CLAIMS.md answered, as one table saved as ``out_dir/seed_claims.csv``; end a
        cell with it. ``rows``: dicts (or tuples with ``columns``) naming the claim with its seed, a ``verdict``
        (holds / holds with a qualification / does not hold) and the number measured or computed here."""
        import pandas as pd

        frame = pd.DataFrame(rows, columns=columns)
        missing = [c for c in SEED_CLAIMS_COLUMNS if c not in frame.columns]
        if frame.empty or missing:
            raise ConfigError(f"seed_claims needs at least one row with the columns {', '.join(SEED_CLAIMS_COLUMNS)}; "
                              f"got {len(frame)} row(s) with {', '.join(map(str, frame.columns)) or 'no columns'}.")
        self.save_table(frame, "seed_claims")
        return SeedClaims(frame)

    def cpu_note(self, text: str) -> CpuNote | None:
        """On a CPU, the sentence saying what this chapter cannot show here (end a cell with it); None on CUDA."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("cpu_note needs the sentence saying what a CPU cannot show.")
        return CpuNote(text.strip()) if self.on_cpu else None

    def recorded(self, name: str, directory: Path | str = RECORDED_DIR) -> Recorded | None:
        """Results recorded on a real GPU (see :func:`load_recorded`), or None when the repo has none.

        Loaded results are noted in ``out_dir/recorded_shown.json`` (name and label), for the report's provenance.
        """
        found = load_recorded(name, directory)
        if found is not None:
            path = self.out_dir / RECORDED_SHOWN
            shown = json.loads(path.read_text()) if path.exists() else {}
            shown[name] = found.label
            path.write_text(json.dumps(shown, indent=1))
        return found

    def published(self, chapter: str) -> PublishedEvidence:
        """The published GPU measurements that bear on chapter ``chapter`` ("07"): each row's source, hardware and
        what the number measures, labelled published, beside memlab's prediction for that setup, the residual and
        what explains it. Saved as ``out_dir/published.csv``."""
        from memlab.compare.published_predict import chapter_frame

        frame = chapter_frame(chapter)
        self.save_table(frame, "published")
        return PublishedEvidence(f"{int(chapter):02d}", frame)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _safe(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name.strip())
    if not cleaned:
        raise ConfigError(f"output name {name!r} is empty after cleaning; use letters, digits, '-', '_' or '.'.")
    return cleaned


NOT_AVAILABLE = "—"
"""What a table cell shows for a value that is missing (NaN, None): not measured here, or not applicable."""


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def reader_number(value: float) -> str:
    """A float as a table cell for a reader: thousands grouped and no decimals from 1,000 up (``4,484,096``,
    ``16,000,000,000``), two decimals from 1 (``23.54``), three significant digits below (``0.222``,
    ``0.0000638``); beyond 10¹⁸ or below 10⁻⁶ in powers of ten as a reader writes them (``1.18 × 10⁻³⁸``), never
    as ``1.18e-38``. NaN is :data:`NOT_AVAILABLE`."""
    if isinstance(value, float) and math.isnan(value):
        return NOT_AVAILABLE
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if value != 0 and (abs(value) >= 1e18 or abs(value) < 1e-6):
        mantissa, exponent = f"{value:.2e}".split("e")  # Python's own rounding, subnormals included
        return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPT)}"
    if abs(value) >= 1000 or value == round(value):
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}"
    digits = 2 - math.floor(math.log10(abs(value)))
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _reader_cell(value: Any) -> str:
    """One cell of a mixed (object) or integer column as :func:`reader_html` shows it."""
    if value is None or (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
                         and math.isnan(value)):
        return NOT_AVAILABLE
    if isinstance(value, bool | np_bool()):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        return reader_number(float(value))
    return str(value)


def np_bool() -> type:
    """NumPy's bool scalar type (a column of flags holds these, not Python bools)."""
    import numpy as np

    return np.bool_


_SNAKE = re.compile(r"^([a-z][a-z0-9]*(?:_[a-z0-9]+)+)((?: \(.*\))?)$")
"""A column named as code (``peak_bytes``, ``last_level (MiB)``): the part a reader's label rewrites."""
_BINARY_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_WORDS = {"tflop": "TFLOP", "flop": "FLOP", "flops": "FLOP", "mfu": "MFU", "hfu": "HFU", "kv": "KV", "gpu": "GPU",
          "cpu": "CPU", "rss": "RSS", "mib": "MiB", "gib": "GiB", "smi": "SMI", "oom": "OOM"}
"""Words of a column name shown in their usual spelling."""


def _label(words: list[str]) -> str:
    return " ".join(_WORDS.get(w, w) for w in words)


def reader_columns(frame: Any) -> Any:
    """``frame`` with its code-style column names as a reader's headers, units in brackets (display only).

    ``*_bytes`` columns are shown in the largest binary unit (B, KiB, MiB, GiB, TiB) their largest value reaches,
    values converted; ``*_fraction``, ``*_share``, ``rel_error`` as percentages (x 100), ``*_pct`` as %; ``*_s`` in
    seconds, ``*_per_s`` as a rate ("tokens/s"), ``*_tflop_s`` in TFLOP/s, ``*_mib`` in MiB; other underscores
    become spaces (``world_size`` -> "world size"), in the index's names too. Names that are not snake_case
    identifiers (``U_cap = held / total (%)``, ``set_to_none=True``) are left as they are, and a name that already
    carries its unit (``kv_cache (GiB)``) keeps it.
    """
    import pandas as pd

    renames: dict[Any, str] = {}
    shown = None
    for col in frame.columns:
        match = _SNAKE.match(col) if isinstance(col, str) else None
        if match is None:
            continue
        words, tail = match.group(1).split("_"), match.group(2)
        numeric = pd.api.types.is_numeric_dtype(frame[col]) and not pd.api.types.is_bool_dtype(frame[col])
        factor, label = 1.0, _label(words) + tail
        if numeric and not tail:
            if words[-1] == "bytes":
                top = float(frame[col].abs().max()) if len(frame) else 0.0
                size, unit = next(((size, u) for size, u in _BINARY_UNITS if top >= size), (1, "B"))
                factor, label = 1 / size, f"{_label(words[:-1])} ({unit})"
            elif match.group(1) == "rel_error" or words[-1] in ("fraction", "share"):
                factor, label = 100.0, f"{'relative error' if words == ['rel', 'error'] else _label(words)} (%)"
            elif words[-1] == "pct":
                label = f"{_label(words[:-1])} (%)"
            elif words[-2:] == ["per", "s"]:
                label = f"{_label(words[:-2])}/s"
            elif words[-2:] == ["tflop", "s"]:
                label = f"{_label(words[:-2])} (TFLOP/s)"
            elif words[-1] in ("s", "mib"):
                label = f"{_label(words[:-1])} ({'s' if words[-1] == 's' else 'MiB'})"
        if factor != 1.0:
            shown = frame.copy() if shown is None else shown
            shown[col] = shown[col].astype(float) * factor
        renames[col] = label
    names = [_label(n.split("_")) if isinstance(n, str) and _SNAKE.match(n) and "(" not in n else n
             for n in frame.index.names]
    if not renames and names == list(frame.index.names):
        return frame
    shown = (frame if shown is None else shown).rename(columns=renames)
    return shown.rename_axis(index=names) if names != list(frame.index.names) else shown


def positional_index(frame: Any) -> bool:
    """True when ``frame``'s index only numbers its rows: one unnamed level of integers (a RangeIndex, or what is
    left of one after filtering or concatenating: 0, 2, 5 or 0, 0), under an unnamed column axis. Such an index is
    pandas' bookkeeping, not a column a reader needs. A named index (``vocabulary``), or a pivot whose column axis
    is named (the index then stands under that name: ``stage``), is data and stays."""
    import pandas as pd

    index = frame.index
    return (index.nlevels == 1 and index.name is None and frame.columns.nlevels == 1 and frame.columns.name is None
            and (isinstance(index, pd.RangeIndex) or pd.api.types.is_integer_dtype(index.dtype)))


def reader_html(frame: Any, *, index: bool | None = None) -> str:
    """A DataFrame as an HTML table for a reader: column names as headers with units (:func:`reader_columns`),
    floats by :func:`reader_number`, integers with thousands separators, missing values as
    :data:`NOT_AVAILABLE`, every cell whole (never cut with "…"). ``index``: None (the default) shows the index
    unless it only numbers the rows (:func:`positional_index`)."""
    import pandas as pd

    if index is None:
        index = not positional_index(frame)
    frame = reader_columns(frame)

    mixed = [col for col, dtype in frame.dtypes.items() if pd.api.types.is_object_dtype(dtype)]
    if mixed:  # pandas prints None in an object column as "None", formatter or not: format the cells first
        frame = frame.copy()
        for col in mixed:
            frame[col] = frame[col].map(_reader_cell)
    formatters = {col: _reader_cell for col, dtype in frame.dtypes.items() if pd.api.types.is_integer_dtype(dtype)}
    with pd.option_context("display.max_colwidth", None):
        html = frame.to_html(index=index, na_rep=NOT_AVAILABLE, float_format=reader_number,
                             formatters=formatters or None,
                             max_rows=pd.get_option("display.max_rows"), notebook=True, border=0,
                             classes="dataframe")
    return _TEXT_CELL.sub(_text_cell, html)


TEXT_CELL_CLASS = "memlab-text"
"""The class :func:`reader_html` gives a cell holding words (any letter), not only a number. In such a cell a long
token (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) may break after ``_ = : /`` (a ``<wbr>``, invisible
when copied), so that its table fits the page; a word is never cut inside, and a number (``23,068,672``) never
wraps (:data:`memlab.course.book.CSS`)."""
_TEXT_CELL = re.compile(r"<td>([^<]*[^\W\d][^<]*)</td>")
_LONG_TOKEN = re.compile(r"\S{16,}")


def _text_cell(m: re.Match[str]) -> str:
    breakable = _LONG_TOKEN.sub(lambda t: re.sub(r"([_=:/])(?=\S)", r"\1<wbr>", t.group(0)), m.group(1))
    return f'<td class="{TEXT_CELL_CLASS}">{breakable}</td>'


def as_percent(frame: Any, columns: list[str] | None = None, digits: int = 2) -> Any:
    """A copy of ``frame`` for display with the fraction ``columns`` (all when None) shown as percentages:
    multiplied by 100, rounded to ``digits`` and renamed ``"NAME (%)"``; where a chapter's text speaks in %."""
    columns = list(frame.columns) if columns is None else columns
    shown = frame.copy()
    for col in columns:
        shown[col] = (100 * shown[col].astype(float)).round(digits)
    return shown.rename(columns={col: f"{col} (%)" for col in columns})


def reader_display() -> None:
    """Set a chapter's kernel to show tables for a reader (:func:`reader_html` for every DataFrame,
    :func:`reader_number` in pandas' text output) and silence :data:`QUIET_WARNINGS`, in this process
    (:func:`chapter` calls it)."""
    import pandas as pd

    pd.set_option("display.float_format", reader_number)
    pd.set_option("display.max_colwidth", None)
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, reader_html)


def chapter(scale: str = "auto", device: str = "auto", seed: int = 0, out_dir: str | Path = "out", *,
            ci_threads: int | None = None) -> Chapter:
    """Resolve a chapter's parameters, seed the random generators, create ``out_dir`` and, inside a notebook, set
    the display for a reader (:func:`reader_display`: rounded numbers in tables, no tqdm notice).

    ``out_dir`` is taken relative to the working directory (``notebooks/`` both in JupyterLab and under
    ``make report``, which injects an absolute path). ``ci_threads``: on a CPU at ``ci`` scale, run torch on this
    many threads (``1`` for tiny models on a shared machine: more threads only add contention, and timings
    repeat); None keeps torch's default, as does every other device and scale.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}.")
    if ci_threads is not None and (isinstance(ci_threads, bool) or not isinstance(ci_threads, int) or ci_threads < 1):
        raise ConfigError(f"ci_threads must be a positive integer or None, got {ci_threads!r}.")
    resolved_device = device_string(device)
    resolved_scale = resolve_scale(scale, resolved_device)
    path = Path(out_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    if ci_threads is not None and resolved_scale == "ci" and resolved_device == "cpu":
        import torch

        torch.set_num_threads(ci_threads)
    if _in_notebook():  # a kernel's display; a test or script calling chapter() keeps pandas as it was
        reader_display()
    logging.getLogger(__name__).info("figures and tables of this chapter go to %s", path)
    return Chapter(scale=resolved_scale, device=resolved_device, seed=seed, out_dir=path)
