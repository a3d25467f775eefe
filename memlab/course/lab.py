"""``make lab``'s preparation: one plain notebook per chapter in ``lab/``, a folder git ignores.

Why copies, not a git filter. The committed chapters are jupytext pairs (``notebooks/NN_topic.py`` and its
``.ipynb``): opened in JupyterLab, each shows twice in the file browser, the pairing rewrites the ``.ipynb`` (the tab
is marked modified before anything runs), and a run saves its outputs into committed files. A git filter such as
nbstripout hides outputs from ``git diff`` only where it is installed; a fresh clone without it still gets dirty
files. So ``make lab`` works on copies: :func:`prepare` writes ``lab/NN_topic.ipynb`` from each ``.py`` (no
pairing metadata, cell ids set, outputs empty), and JupyterLab opens ``lab/``. Running a chapter there writes its
outputs into ``lab/`` and its figures and tables into ``reports/build/`` (the chapters' ``out_dir`` is
``../reports/build/NN_topic``, relative to the notebook, the same from ``lab/`` as from ``notebooks/``): both are
ignored, so ``git status`` stays clean.

A learner's copy is never overwritten: a chapter whose source is newer than its copy is listed, and
``python -m memlab.course.lab --fresh`` (``make lab FRESH=1``) replaces the copies.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from memlab.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
LAB_DIR = REPO_ROOT / "lab"
"""Where ``make lab`` puts the learner's copies (listed in ``.gitignore``)."""
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` did: copies written, copies kept (the learner's), and kept copies older than their
    source."""

    written: tuple[Path, ...]
    kept: tuple[Path, ...]
    stale: tuple[Path, ...]


def chapter_sources(notebooks: Path = NOTEBOOKS) -> list[Path]:
    """The chapters' jupytext sources, ``NN_topic.py``, in course order."""
    return sorted(Path(notebooks).glob("[0-9][0-9]_*.py"))


def _language_info() -> dict:
    """What the python3 kernel reports on start (ipykernel's language_info): JupyterLab writes it into the notebook
    when the kernel starts, so a copy without it would be marked modified as soon as it is opened."""
    try:
        from ipykernel.ipkernel import IPythonKernel
    except ImportError:  # no kernel installed here: JupyterLab will fill it in
        return {"name": "python"}
    return dict(IPythonKernel.language_info)


def lab_notebook(source: Path):
    """The chapter at ``source`` as a plain nbformat-4 notebook: no jupytext metadata, cell ids set, no outputs."""
    import jupytext
    import nbformat

    nb = jupytext.read(source)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata["language_info"] = _language_info()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.nbformat, nb.nbformat_minor = 4, 5
    _, nb = nbformat.validator.normalize(nb)
    nb = nbformat.from_dict(nb)
    nbformat.validate(nb)
    return nb


def prepare(dest: Path = LAB_DIR, *, fresh: bool = False, notebooks: Path = NOTEBOOKS) -> Prepared:
    """Write ``dest/NN_topic.ipynb`` for every chapter that has no copy there yet (every chapter when ``fresh``)."""
    import nbformat

    sources = chapter_sources(notebooks)
    if not sources:
        raise ConfigError(f"no chapters (NN_topic.py) in {notebooks}: run make lab from the repository root.")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written, kept, stale = [], [], []
    for source in sources:
        target = dest / f"{source.stem}.ipynb"
        if target.exists() and not fresh:
            kept.append(target)
            if source.stat().st_mtime > target.stat().st_mtime:
                stale.append(target)
            continue
        nbformat.write(lab_notebook(source), target)
        written.append(target)
    return Prepared(tuple(written), tuple(kept), tuple(stale))


def main(argv: list[str] | None = None) -> int:
    """``python -m memlab.course.lab [--fresh] [--dest DIR]``: prepare the copies and say what was done."""
    parser = argparse.ArgumentParser(prog="python -m memlab.course.lab", description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", action="store_true", help="replace existing copies (a learner's edits are lost)")
    parser.add_argument("--dest", type=Path, default=LAB_DIR, help=f"where the copies go (default {LAB_DIR})")
    args = parser.parse_args(argv)
    try:
        done = prepare(args.dest, fresh=args.fresh)
    except ConfigError as err:
        print(f"memlab lab: {err}", file=sys.stderr)
        return 2
    print(f"lab: {len(done.written)} chapter(s) copied, {len(done.kept)} kept in {args.dest}")
    if done.stale:
        names = ", ".join(p.name for p in done.stale)
        print(f"lab: newer in notebooks/ than your copy: {names} (make lab FRESH=1 replaces every copy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
