"""memlab.course.book, glossary, bibliography, figures: the pieces of the book, without building it.

Over the real chapters (their markdown, read with jupytext: no kernel): every citation resolves to a row of
SOURCES.md, every glossary term a chapter uses is linked at its first use and nowhere else, every chapter states
its belief. On generated inputs: the plumbing filter, the citation and term linkers, the figure-overlap check.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jupytext
import matplotlib
import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.course import bibliography, book, booksearch, glossary
from memlab.course.figures import figure_overlaps

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


@functools.cache
def _markdown(source: Path) -> list[str]:
    return [c.source for c in jupytext.read(source).cells if c.cell_type == "markdown"]


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_every_citation_in_a_chapter_names_a_source(source: Path) -> None:
    text = "\n".join(glossary.prose(m) + "\n" + "\n".join(re.findall(r"`[^`\n]*`", m)) for m in _markdown(source))
    assert not bibliography.unresolved_citations(text), "add the key to memlab/SOURCES.md or fix the citation"


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_every_glossary_term_a_chapter_uses_is_linked_at_its_first_use(source: Path) -> None:
    cells = _markdown(source)
    used = glossary.first_uses(cells)
    linked = [glossary.link_first_uses([bibliography.link_citations(c) for c in cells])]
    roles = glossary.linked_terms("\n".join(linked[0]))
    assert sorted(roles) == sorted(used), "each used term is linked exactly once"
    for text in linked[0]:
        for m in re.finditer(r"\{term\}`([^`<]*?) <([^>]+)>`", text):
            shown, name = m.groups()
            assert shown == used[name], f"{name}: linked at {shown!r}, first used as {used[name]!r}"
    assert used, "a chapter uses at least one glossary term"


def test_glossary_terms_are_defined_once_and_the_page_lists_them_all() -> None:
    names = [t.name.lower() for t in glossary.GLOSSARY]
    assert len(names) == len(set(names)), "a term is defined twice"
    page = glossary.glossary_markdown()
    for term in glossary.GLOSSARY:
        assert f"\n{term.name}\n  " in page
    assert not bibliography.unresolved_citations(page)


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_every_chapter_states_its_belief_for_the_course_map(source: Path) -> None:
    found = book.belief(jupytext.read(source))
    assert len(found) > 20 and "**" not in found and "[seed" not in found, found


def test_linking_leaves_code_headings_links_and_math_alone() -> None:
    text = ("## MFU\nMFU and `MFU` and [MFU](x.md) and ```\nMFU\n``` then MFU again [chowdhery2022] "
            "and `[chowdhery2022]` and [not-a-key] and [text](url)")
    linked = glossary.link_first_uses([bibliography.link_citations(text)])[0]
    assert linked.startswith("## MFU\n{term}`MFU <MFU>` and `MFU` and [MFU](x.md)")
    assert linked.count("{term}") == 1 and "then MFU again" in linked
    assert linked.count("{ref}`[chowdhery2022] <ref-chowdhery2022>`") == 2
    assert bibliography.unresolved_citations(text) == ["not-a-key"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["MFU", "HFU", "the", "ZeRO-3", "`x`", "KV cache", "\n\n", "roofline", "bf16", ","]),
                max_size=30), st.integers(1, 4))
def test_each_term_is_linked_once_whatever_the_text(words: list[str], cells: int) -> None:
    texts = [" ".join(words[i::cells]) for i in range(cells)]
    linked = glossary.link_first_uses(texts)
    roles = glossary.linked_terms("\n".join(linked))
    assert len(roles) == len(set(roles)) and sorted(roles) == sorted(glossary.first_uses(texts))
    plain = [re.sub(r"\{term\}`([^`<]*?) <[^>]+>`", r"\1", t) for t in linked]
    assert plain == texts, "linking changes no word"


def test_sources_parse_into_every_row_with_a_link_target() -> None:
    rows = bibliography.sources()
    lines = [ln for ln in bibliography.SOURCES_MD.read_text().splitlines() if re.match(r"\| [a-z]", ln)]
    assert len(rows) == len(lines) - 1 and "korthikanti2022" in rows  # minus the header row
    page = bibliography.references_markdown()
    assert all(f"({src.label})=" in page for src in rows.values())
    assert 'href="https://arxiv.org/abs/2205.05198"' in page


def _nb(*outputs: dict) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("x = 2", metadata={"tags": ["injected-parameters"]}),
                nbformat.v4.new_markdown_cell("# T\n\n**The common belief.** \"MFU is 50 %\" [seed-001]. More."),
                nbformat.v4.new_code_cell("f()", outputs=[nbformat.from_dict(o) for o in outputs])]
    return nb


def test_chapter_page_drops_parameters_and_plumbing_and_scrubs_paths() -> None:
    result = {"output_type": "execute_result", "execution_count": 1, "metadata": {}}
    nb = _nb({**result, "data": {"text/plain": "PosixPath('/home/me/reports/build/x.png')"}},
             {**result, "data": {"text/plain": "'No GPU run is recorded yet.'"}},
             {**result, "data": {"text/plain": "42"}},
             {"output_type": "stream", "name": "stdout", "text": "saved /home/me/reports/a.csv\n"},
             {"output_type": "stream", "name": "stderr", "text": "USDT:2026-12-01 14:41:49 24783:24783 "
              "SyncActivityProfilerHandler.cpp:52] profiler_start\n"},
             {"output_type": "stream", "name": "stderr", "text": "real trouble\n"})
    page = book.chapter_page(nb, {"/home/me/reports": "[report]"})
    assert [c.source for c in page.cells if c.cell_type == "code"] == ["f()"], "both parameter cells are gone"
    outputs = page.cells[-1].outputs
    assert [o.output_type for o in outputs] == ["display_data", "execute_result", "stream", "stream"]
    assert outputs[3].text == "real trouble\n", "only the profiler's trace lines are dropped"
    assert outputs[0].data == {"text/markdown": "No GPU run is recorded yet."}
    assert outputs[2].text == "saved [report]/a.csv\n"
    assert "{ref}`[seed-001] <ref-seed-001>`" in page.cells[0].source and "{term}`MFU <MFU>`" in page.cells[0].source
    assert book.belief(_nb()) == '"MFU is 50 %".'
    long = _nb()
    long.cells[-1].source = "\n".join(f"x{i} = {i}" for i in range(book.FOLD_CODE_LINES + 1))
    folded = book.chapter_page(long, {}).cells[-1]
    assert "hide-input" in folded.metadata["tags"], "a long code cell is folded"
    assert "hide-input" not in page.cells[-1].metadata.get("tags", []), "a short one is not"


def test_figure_overlap_check_sees_labels_on_labels_and_legends_on_data() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [0, 1, 2], label="rising")
    ax.legend(loc="upper left")
    ax.set(title="t", xlabel="x (s)", ylabel="y (B)")
    assert figure_overlaps(fig) == [], "a clean figure"
    ax.legend(loc="center")
    ax.text(0.2, 1.5, "peak")
    ax.text(0.22, 1.5, "peak, again")
    found = [str(o) for o in figure_overlaps(fig)]
    assert any("text 'peak' overlaps text 'peak, again'" in f for f in found)
    assert any(f.startswith("legend overlaps data of line 'rising'") for f in found)
    plt.close(fig)


def test_a_span_behind_the_data_is_not_data_and_a_suptitle_is_one_text() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [0, 1, 0.5])
    ax.axvspan(0.9, 1.6, alpha=0.2, label="band")
    ax.text(1.0, 0.1, "in the band")
    fig.suptitle("one title")
    assert figure_overlaps(fig) == []
    ax.bar([1.2], [0.4], width=0.2)  # under part of the text (a text wholly inside a bar is its label)
    assert [o.second for o in figure_overlaps(fig)] == ["bar '_nolegend_'"], "a bar under a text is data"
    plt.close(fig)


def test_a_label_wholly_inside_its_bar_is_the_bars_label() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.barh([0], [10], left=[0], height=0.8)
    ax.set_xlim(0, 10)
    ax.text(5, 0, "t1", ha="center", va="center", fontsize=7)  # a segment diagram names its block inside it
    assert figure_overlaps(fig) == []
    ax.text(9.8, 0, "spills over the end", va="center", fontsize=7)
    assert [o.first for o in figure_overlaps(fig)] == ["text 'spills over the end'"]
    plt.close(fig)


@pytest.mark.parametrize(("text", "first"), [
    ('He said "a. B" then. Next one.', 'He said "a. B" then.'),
    ("“Quoted. Still” here! After.", "“Quoted. Still” here!"),
    ('"All of it."', '"All of it."'),
    ("no end", "no end"),
])
def test_first_sentence_does_not_end_inside_a_quotation(text: str, first: str) -> None:
    assert book.first_sentence(text) == first


def test_the_course_map_links_built_chapters_and_names_the_others() -> None:
    chapters = [book.BookChapter("00", "00_a", "A", "ok", "belief a", "00_a"),
                book.BookChapter("01", "01_b", "B", "not run", "belief b"),
                book.BookChapter("02", "02_c", "C", "planned")]
    page = book.landing_markdown(chapters, solutions=False)
    assert "| 00 | {doc}`A <00_a>` | belief a |" in page and "{doc}`the first chapter <00_a>`" in page
    assert "| 01 | B (not built yet: run its chapter) | belief b |" in page
    assert "| 02 | C (planned) | (not written yet) |" in page
    toc = page[page.index("```{toctree}"):]
    assert "00_a" in toc and "01_b" not in toc and toc.index("00_a") < toc.index("seeds") < toc.index("glossary")
    first = toc.splitlines()[4]
    assert first == "00_a", "the landing's Next is the chapter 'Start here' names, not the seed articles"
    assert "instructor build" in book.landing_markdown(chapters, solutions=True)


@settings(max_examples=15, deadline=None)
@given(st.floats(0.05, 0.6), st.floats(0.05, 0.9), st.text("abcdefgh", min_size=1, max_size=8))
def test_two_texts_overlap_exactly_when_drawn_on_each_other(x: float, y: float, label: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_axis_off()
    ax.text(x, y, label, transform=ax.transAxes)
    ax.text(x + 0.3, y, label, transform=ax.transAxes)  # 0.3 of 6 in is wider than 8 letters at 10 pt
    assert figure_overlaps(fig) == []
    ax.text(x + 0.005, y, label + "!", transform=ax.transAxes)
    found = figure_overlaps(fig)
    assert len(found) == 1 and found[0].first == f"text {label!r}" and found[0].pixels > 0
    plt.close(fig)


def test_the_readme_course_map_lists_every_chapter() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Course map"):]
    listed = set(re.findall(r"^\| (\d\d) \|", section, re.M))
    assert listed == {p.name[:2] for p in SOURCES}, f"README's course map lists {sorted(listed)}"


def test_search_text_is_what_a_reader_sees_and_cannot_end_its_script() -> None:
    body = ('<section id="s"><h1>Title<a class="headerlink" href="#s">¶</a></h1><p>Gradient <em>checkpointing</em>'
            '&amp; more<br>next</p><script>var x = "no";</script><style>p {}</style><img src="a.png"></section>')
    assert booksearch.page_text(body) == "Title Gradient checkpointing & more next"
    script = booksearch.search_script({"01_x": "a </script> b"}, {"glossary.html#term-x": {"term": "x", "text": "x d"}})
    assert "</script>" not in script and "MEMLAB_PAGE_TEXT" in script and '"term": "x"' in script


def test_printed_lines_wrap_instead_of_running_off_the_page() -> None:
    """A print()ed conclusion wraps inside the article (the learner found lines cut at 1024 px on chapters 01 and
    12); a browser check at 1024 px found 22 cut blocks on chapters 07, 11 and 12 without it and none with it."""
    from memlab.course.book import CSS

    assert ".cell_output pre, .cell_input pre, div.highlight pre { white-space: pre-wrap;" in CSS
