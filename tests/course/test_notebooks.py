"""Notebook conventions: each notebooks/NN_topic.py is paired with an in-sync NN_topic.ipynb without outputs, has
the kernelspec papermill needs and a tagged `parameters` cell with exactly scale, device, seed and out_dir."""

from __future__ import annotations

import ast
import json
import re
import tomllib
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
REQUIRED_CHAPTERS = ("00", "02")  # the chapters every checkout must have


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def _inputs(nb) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in nb.cells]


def _parameters_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]


def test_the_course_has_the_first_chapters() -> None:
    have = {p.name[:2] for p in SOURCES}
    assert set(REQUIRED_CHAPTERS) <= have, f"missing chapters {sorted(set(REQUIRED_CHAPTERS) - have)}"


def test_jupytext_pairs_py_percent_with_ipynb() -> None:
    config = tomllib.loads((NOTEBOOKS / "jupytext.toml").read_text())
    assert set(config["formats"].split(",")) == {"ipynb", "py:percent"}


def test_every_ipynb_has_its_py_source() -> None:
    orphans = [p.name for p in NOTEBOOKS.glob("*.ipynb") if not p.with_suffix(".py").exists()]
    assert not orphans, f"{orphans} have no .py source: write the .py (the source of truth) and run `make sync`"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_pair_is_in_sync(source: Path) -> None:
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make sync`"
    assert _inputs(jupytext.read(source)) == _inputs(jupytext.read(ipynb)), (
        f"{source.name} and {ipynb.name} differ: run `make sync` (the .py is the source of truth)")


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_ipynb_is_committed_without_outputs(source: Path) -> None:
    nb = json.loads(source.with_suffix(".ipynb").read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c.get("outputs") or
                                                                                 c.get("execution_count"))]
    assert not dirty, f"cells {dirty} of {source.stem}.ipynb hold outputs: run `make sync` (it strips them)"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_kernelspec_is_in_the_py_header(source: Path) -> None:
    kernelspec = jupytext.read(source).metadata.get("kernelspec", {})
    assert kernelspec.get("name") == "python3" and kernelspec.get("language") == "python", (
        f"{source.name}: the header needs the python3 kernelspec (papermill runs it)")


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_parameters_cell_has_exactly_scale_device_seed_out_dir(source: Path) -> None:
    cells = _parameters_cells(jupytext.read(source))
    assert len(cells) == 1, f"{source.name}: needs exactly one code cell tagged 'parameters', found {len(cells)}"
    values = {}
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, "only plain assignments"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    assert list(values) == ["scale", "device", "seed", "out_dir"]
    assert values["scale"] == "auto" and values["device"] == "auto" and values["seed"] == 0
    assert values["out_dir"] == f"../reports/build/{source.stem}", "a default that works from notebooks/"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_chapter_starts_with_a_title_and_ends_with_exercises_and_a_summary(source: Path) -> None:
    nb = jupytext.read(source)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), "a '# Title' first"
    text = "\n".join(c.source for c in nb.cells)
    assert re.search(rf'\bcheck\("{source.name[:2]}\.', text), (
        "self-checking exercises: check(\"NN.name\", answer) calls into the chapter's bank (memlab.course.bank)")
    assert "## Summary" in text, "a '## Summary' section"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_no_markdown_is_lost_inside_a_code_cell(source: Path) -> None:
    """A missing ``# %% [markdown]`` marker turns a paragraph into comments of a code cell (the learner found
    chapter 09's "The 85-95 % rule" shown as Python comments): no code cell holds a bold markdown line."""
    lost = [i for i, c in enumerate(jupytext.read(source).cells) if c.cell_type == "code"
            and any(re.match(r"# \*\*\S", line) for line in c.source.splitlines())]
    assert not lost, f"{source.name}: cells {lost} hold markdown as comments (a lost '# %% [markdown]' marker)"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_a_chapter_names_its_own_number(source: Path) -> None:
    """After a renumbering (05 split in two, 06-11 became 07-12) every number a chapter gives itself is the one in its
    file name: its title, ``ch.published("NN")``, ``ch.recorded("NN_...")`` and its exercises' ids."""
    number, text = source.name[:2], source.read_text()
    title = next(c for c in jupytext.read(source).cells if c.cell_type == "markdown").source
    assert title.startswith(f"# {number} · "), f"{source.name}: the title must start '# {number} · '"
    wrong = [m.group(0) for m in re.finditer(r'published\("(\d\d)"\)|recorded\("(\d\d)_|check\("(\d\d)\.', text)
             if next(g for g in m.groups() if g) != number]
    assert not wrong, f"{source.name} names another chapter's number: {wrong}"
