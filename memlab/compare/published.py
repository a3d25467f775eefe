"""Published GPU measurements: the ledger of figures others measured on accelerators, with their provenance.

No GPU has been available to this project, so the accelerator evidence the course shows is the published record
(issue 35): frameworks' benchmark tables, fine-tuning libraries' READMEs and the Hugging Face docs, each figure
read at its source. ``data/published/ledger.csv`` holds one row per figure: the exact quote, the figure and its
unit, what it measures (:data:`KINDS`), the GPU, the versions, the full setup as the source states it, the source
URL pinned to a commit with a locator (table and line), and in ``inferred`` which fields were read from the
source's own configs (path and commit) rather than from the figure's sentence. ``memlab_model`` and
``memlab_setup`` translate the setup into a memlab preset and :class:`~memlab.predict.spec.setup.Setup` fields;
``memlab_gap`` says why a row has none. Nothing here is fitted to these rows: the predictions next to them
(:mod:`memlab.compare.published_predict`) use memlab's terms as they are.

:func:`published_rows` reads and checks the file; a malformed file is one :class:`~memlab.errors.MemlabError`
line naming the line and the field.
"""

from __future__ import annotations

import csv
import re
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError
from memlab.predict.spec.model import preset_names

if TYPE_CHECKING:
    import pandas as pd

PUBLISHED_CSV = Path(__file__).resolve().parents[2] / "data" / "published" / "ledger.csv"
"""The ledger of published GPU measurements (plain CSV, one row per figure)."""

KINDS = ("max_allocated", "reserved", "active", "nvidia_smi_used", "step_time_s", "tokens_per_s", "mfu", "other")
"""What a figure measures: the caching allocator's peak allocated, peak reserved or peak active bytes; nvidia-smi's
(NVML's) used memory; a step or call time; a throughput; model FLOPs utilisation; ``other`` (a figure whose source
does not say which of these it is, or a samples/s throughput)."""

KIND_WORDS = {"max_allocated": "peak allocated", "reserved": "peak reserved", "active": "peak active",
              "nvidia_smi_used": "nvidia-smi used", "step_time_s": "step time", "tokens_per_s": "throughput",
              "mfu": "MFU", "other": "a peak the source does not name"}
"""Each of :data:`KINDS` as a page says it."""

MEMORY_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "MB": 10**6, "GB": 10**9}
"""Byte units a figure may carry, as the source writes them (GB = 1e9 B, GiB = 2**30 B)."""

OTHER_UNITS = ("s", "tokens/s", "tokens/s/GPU", "samples/s", "%")
"""Units of the time, throughput and utilisation figures."""

SOURCE_FLOPS = ("6*all_params+12*l*h*q*t", "6*N+12*l*d*T")
"""The sources' own FLOPs-per-token formulas a row may name in ``source_flops`` (its MFU's definition): torchtitan's
6 x all parameters + 12 * layers * heads * head_dim * seq on memlab's config, and llm-foundry's 6 x NumParams +
12 * layers * d_model * seq with ``;l=..;d=..`` from the source's model yaml."""

REQUIRED = ("row_id", "source_id", "source", "url", "version", "locator", "quote", "figure", "unit", "kind", "gpu")
"""Fields every row must fill."""


@dataclass(frozen=True)
class PublishedRow:
    """One published GPU figure with its provenance and setup, as ``data/published/ledger.csv`` holds it.

    Text fields are the source's words (``not stated`` where it is silent); ``figure`` is the quoted number in
    ``unit``. ``memlab_setup`` is ``key=value`` pairs separated by ``;`` (:func:`parse_setup`), ``memlab_approx``
    the pairs changed when memlab refuses the setup as given, ``chapters`` the chapters the row bears on
    (``02;11``).
    """

    row_id: str
    source_id: str
    source: str
    url: str
    version: str
    locator: str
    quote: str
    figure: float
    unit: str
    kind: str
    gpu: str
    gpu_memory: str = ""
    devices: str = ""
    software: str = ""
    model: str = ""
    precision: str = ""
    optimizer: str = ""
    batch: str = ""
    seq: str = ""
    checkpointing: str = ""
    attention: str = ""
    parallel: str = ""
    finetune: str = ""
    other_setup: str = ""
    memlab_model: str = ""
    memlab_setup: str = ""
    memlab_approx: str = ""
    memlab_gpu: str = ""
    tokens_per_s_per_device: str = ""
    source_flops: str = ""
    memlab_gap: str = ""
    chapters: str = ""
    inferred: str = ""

    @property
    def is_memory(self) -> bool:
        """Whether the figure is a number of bytes (its unit is one of :data:`MEMORY_UNITS`)."""
        return self.unit in MEMORY_UNITS

    @property
    def figure_bytes(self) -> int | None:
        """The figure in bytes (None for a time, throughput or utilisation)."""
        return round(self.figure * MEMORY_UNITS[self.unit]) if self.is_memory else None

    @property
    def chapter_list(self) -> tuple[str, ...]:
        """The two-digit chapter numbers the row bears on."""
        return tuple(c.strip() for c in self.chapters.split(";") if c.strip())

    @property
    def setup_fields(self) -> dict[str, Any]:
        """``memlab_setup`` as Setup keyword arguments."""
        return parse_setup(self.memlab_setup)

    @property
    def label(self) -> str:
        """``published: <figure> <unit> <kind> on <gpu> (<source>)``: how a chapter labels the row."""
        return f"published: {self.figure:g} {self.unit} {self.kind} on {self.gpu} ({self.source}, {self.locator})"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return asdict(self)


COLUMNS = tuple(f.name for f in fields(PublishedRow))
"""The CSV header, in order: one column per :class:`PublishedRow` field."""


def _value(text: str) -> Any:
    """A Setup value from its text: true/false, an int, a float, else the string."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_setup(text: str) -> dict[str, Any]:
    """``"batch=2;seq=8192;sp=true"`` -> ``{"batch": 2, "seq": 8192, "sp": True}`` (empty text: ``{}``)."""
    out: dict[str, Any] = {}
    for pair in (p.strip() for p in text.split(";") if p.strip()):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise MemlabError(f"memlab setup {text!r}: {pair!r} is not key=value (pairs are separated by ';')")
        out[key.strip()] = _value(value.strip())
    return out


def _check_memlab_model(raw: dict[str, str], where: str) -> None:
    """``memlab_model`` is a preset name, or ``params:N`` (a bare parameter count, for an MFU row only)."""
    name = raw.get("memlab_model") or ""
    if name.startswith("params:"):
        setup = raw.get("memlab_setup") or ""
        if not name[7:].isdigit() or raw["unit"] in MEMORY_UNITS or not re.fullmatch(r"seq=\d+", setup):
            raise MemlabError(f"{where}: memlab_model {name!r}: params:N takes a whole parameter count, on a "
                              "throughput or MFU row whose memlab_setup is only seq=T")
    elif name and name not in preset_names():
        raise MemlabError(f"{where}: memlab_model {name!r} is not a memlab preset "
                          "(memlab.predict.spec.model.preset_names)")


def _row(raw: dict[str, str], where: str) -> PublishedRow:
    """One checked row: required fields filled, a known kind and unit, a number, a parsable setup."""
    empty = [k for k in REQUIRED if not (raw.get(k) or "").strip()]
    if empty:
        raise MemlabError(f"{where}: empty {', '.join(empty)}: every published row needs {', '.join(REQUIRED)}")
    if raw["kind"] not in KINDS:
        raise MemlabError(f"{where}: kind {raw['kind']!r} is not one of {', '.join(KINDS)}")
    if raw["unit"] not in MEMORY_UNITS and raw["unit"] not in OTHER_UNITS:
        raise MemlabError(f"{where}: unit {raw['unit']!r} is not one of {', '.join([*MEMORY_UNITS, *OTHER_UNITS])}")
    try:
        figure = float(raw["figure"])
    except ValueError:
        raise MemlabError(f"{where}: figure {raw['figure']!r} is not a number (write the quoted figure, e.g. 82.4)")\
            from None
    if raw["kind"] in ("max_allocated", "reserved", "active", "nvidia_smi_used") and raw["unit"] not in MEMORY_UNITS:
        raise MemlabError(f"{where}: kind {raw['kind']} is a memory figure but its unit is {raw['unit']!r}")
    _check_memlab_model(raw, where)
    if raw.get("source_flops") and raw["source_flops"].split(";")[0] not in SOURCE_FLOPS:
        raise MemlabError(f"{where}: source_flops {raw['source_flops']!r} is not one of {', '.join(SOURCE_FLOPS)}")
    if raw.get("memlab_setup") and not raw.get("memlab_model"):
        raise MemlabError(f"{where}: memlab_setup without memlab_model: name the preset the setup applies to")
    if not raw.get("memlab_model") and raw["unit"] in MEMORY_UNITS and not raw.get("memlab_gap"):
        raise MemlabError(f"{where}: a memory row with no memlab_model needs memlab_gap (why memlab cannot express it)")
    try:
        parse_setup(raw.get("memlab_setup") or "")
        parse_setup(raw.get("memlab_approx") or "")
    except MemlabError as exc:
        raise MemlabError(f"{where}: {exc}") from None
    return PublishedRow(**{**{k: (raw.get(k) or "") for k in COLUMNS}, "figure": figure})


def read_published(path: Path | str = PUBLISHED_CSV) -> tuple[PublishedRow, ...]:
    """Read and check a published ledger file (uncached: :func:`published_rows` caches the shipped one)."""
    path = Path(path)
    if not path.is_file():
        raise MemlabError(f"no published ledger at {path}: the file ships as data/published/ledger.csv")
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = tuple(reader.fieldnames or ())
        if header != COLUMNS:
            missing = [c for c in COLUMNS if c not in header]
            extra = [c for c in header if c not in COLUMNS]
            raise MemlabError(f"{path.name}: the header must be the PublishedRow fields in order; missing "
                              f"{missing or 'none'}, unknown {extra or 'none'}")
        rows = [_row(raw, f"{path.name} line {reader.line_num}") for raw in reader]
    ids = [r.row_id for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise MemlabError(f"{path.name}: row_id {dup[0]!r} appears more than once: each figure gets its own id")
    return tuple(rows)


@lru_cache(maxsize=4)
def _cached(path: str) -> tuple[PublishedRow, ...]:
    return read_published(path)


def published_rows(path: Path | str = PUBLISHED_CSV, *, chapter: str | None = None,
                   kind: str | None = None) -> tuple[PublishedRow, ...]:
    """The published rows (the shipped ledger by default), optionally those bearing on ``chapter`` ("07") or of
    one ``kind``."""
    rows = _cached(str(Path(path).resolve()))
    if chapter is not None:
        if not str(chapter).isdigit():
            raise MemlabError(f"chapter {chapter!r}: give the chapter's number, e.g. '07'")
        rows = tuple(r for r in rows if f"{int(chapter):02d}" in r.chapter_list)
    if kind is not None:
        if kind not in KINDS:
            raise MemlabError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        rows = tuple(r for r in rows if r.kind == kind)
    return rows


def to_frame(rows: tuple[PublishedRow, ...] | None = None) -> pd.DataFrame:
    """The rows as a DataFrame (every field a column)."""
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in (published_rows() if rows is None else rows)], columns=list(COLUMNS))


SNAPSHOTS_DIR = PUBLISHED_CSV.parent / "allocator_snapshots"
"""Allocator snapshots others recorded on real GPUs, reduced (``scripts/reduce_snapshot.py``); its README says more."""


def snapshot_checks(folder: Path | str = SNAPSHOTS_DIR) -> list[dict[str, Any]]:
    """memlab's caching allocator model against each published snapshot in ``folder``: one row per file, with its
    source, the events replayed, the segments the allocator held when the history began (rebuilt first), the
    segments the GPU and the model made during it and whether they agree (sizes, in order; ``first_difference``
    where not), whether the final layouts agree, the GPU's and the model's reserved bytes at the end, and the
    frees of blocks allocated before the history (``unplaced_frees``: a start no seed can rebuild whole)
    (:func:`memlab.measure.snapshot.segment_check`). Published GPU data replayed on a CPU; nothing is fitted."""
    import json

    from memlab.measure.snapshot import expand_reduced, segment_check

    out = []
    for path in sorted(Path(folder).glob("*.json")):
        reduced = json.loads(path.read_text())
        r = segment_check(expand_reduced(reduced))
        gpu, model = r["snapshot_reserved_bytes"], r["model_end_reserved_bytes"]
        pairs = list(zip(r["snapshot"], r["model"], strict=False))
        first = next((i for i, (a, b) in enumerate(pairs) if a != b),
                     None if len(r["snapshot"]) == len(r["model"]) else len(pairs))
        out.append({"snapshot": path.stem, "source": reduced["provenance"].get("source", ""),
                    "note": reduced["provenance"].get("note", ""), "events": len(reduced["events"]),
                    "seeded_segments": r["seeded_segments"], "gpu_segments_made": len(r["snapshot"]),
                    "model_segments_made": len(r["model"]), "segments_match": r["match"],
                    "first_difference": first, "layout_match": r["layout_match"], "gpu_reserved_bytes": gpu,
                    "model_reserved_bytes": model, "reserved_error": (model - gpu) / gpu if gpu else 0.0,
                    "unplaced_frees": r["unplaced_frees"]})
    return out
