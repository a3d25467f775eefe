"""The book's one bibliography, generated from ``memlab/SOURCES.md``, and the citations that link into it.

Chapters cite by key in square brackets, ``[korthikanti2022]`` (often inside backticks). :func:`link_citations`
turns each cited key into a link to its entry on the references page; :func:`unresolved_citations` lists the
bracketed keys that name no row of SOURCES.md (a test fails on any). Nothing here is fetched: the page is built
from the table in the repository.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SOURCES_MD = Path(__file__).resolve().parents[1] / "SOURCES.md"
REFERENCES_DOC = "references"
"""The references page's document name in the book (``references.md``)."""
CITATION = re.compile(r"`?\[([a-z][a-z0-9]*(?:[-.][a-z0-9]+)*)\]`?(?!\()")
"""A citation as chapters write it: ``[key]`` or ```[key]``` (a markdown link ``[text](url)`` is not one)."""


@dataclass(frozen=True)
class Source:
    """One row of SOURCES.md: its key, title, authors, year and where to find it (a URL, arXiv id or path)."""

    key: str
    title: str
    authors: str
    year: str
    where: str

    @property
    def label(self) -> str:
        """The target name of this entry on the references page."""
        return f"ref-{self.key}"


def parse_sources(text: str) -> dict[str, Source]:
    """The rows of a SOURCES.md table (``| key | title | authors | year | where |``), by key, in file order."""
    rows: dict[str, Source] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5 or cells[0] in ("key", "") or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0]] = Source(*cells)
    return rows


@cache
def sources(path: Path = SOURCES_MD) -> dict[str, Source]:
    """The parsed rows of ``memlab/SOURCES.md`` (read once per process)."""
    return parse_sources(Path(path).read_text(encoding="utf-8"))


def _href(where: str) -> str | None:
    """A clickable address for a ``where`` cell: its first URL-like part or arXiv id; None for a local path."""
    first = where.split(";")[0].strip().strip("`")
    arxiv = re.fullmatch(r"arXiv:(\d{4}\.\d{4,5})", first)
    if arxiv:
        return f"https://arxiv.org/abs/{arxiv.group(1)}"
    doi = re.search(r"doi:(10\.\S+)", where)
    if doi:
        return f"https://doi.org/{doi.group(1)}"
    if re.match(r"^(?:[\w-]+\.)+[a-z]{2,}(?:/\S*)?$", first):
        return f"https://{first}"
    return None


def references_markdown(rows: dict[str, Source] | None = None) -> str:
    """The references page (MyST markdown): one entry per row with a target ``ref-KEY`` that citations link to.

    Addresses are plain links a reader may follow; the page itself loads nothing from them."""
    rows = sources() if rows is None else rows
    parts = ["# References", "",
             "Every source the chapters and memlab's docstrings cite, from `memlab/SOURCES.md`, by key. Facts and "
             "formulas are taken from these with the citation; memlab's prose and code are its own. The three seed "
             "articles are introduced on {doc}`the seed articles page <seeds>`.", ""]
    for src in rows.values():
        href = _href(src.where)
        where = html.escape(src.where)
        if href:
            where = f'<a class="reference external" href="{html.escape(href)}">{where}</a>'
        parts += [f"({src.label})=", "",
                  f"**[{src.key}]** {src.authors} ({src.year}). *{src.title}*. {where}", ""]
    return "\n".join(parts)


def _role(key: str) -> str:
    return f"{{ref}}`[{key}] <ref-{key}>`"


def link_citations(text: str, rows: dict[str, Source] | None = None) -> str:
    """``text`` (markdown) with every ``[key]`` of a known source replaced by a link to its reference entry."""
    rows = sources() if rows is None else rows
    return CITATION.sub(lambda m: _role(m.group(1)) if m.group(1) in rows else m.group(0), text)


def unresolved_citations(text: str, rows: dict[str, Source] | None = None) -> list[str]:
    """The bracketed keys in ``text`` that name no source (each once, in order of first use)."""
    rows = sources() if rows is None else rows
    found = [m.group(1) for m in CITATION.finditer(text) if m.group(1) not in rows]
    return list(dict.fromkeys(found))
