"""make lab's preparation (memlab.course.lab): one plain copy per chapter in a git-ignored folder; opening one is not
a modification, and running one leaves `git status` as it was."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from memlab.course import lab

ROOT = Path(__file__).resolve().parents[2]
SMALL = "02_bytes_per_param"  # its first exercise is checked a few cells in: estimate only, no training run


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _committed_notebooks() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((ROOT / "notebooks").glob("*"))}


def test_one_plain_notebook_per_chapter_and_opening_it_changes_nothing(tmp_path: Path) -> None:
    done = lab.prepare(tmp_path)
    chapters = {p.stem for p in lab.chapter_sources()}
    assert {p.stem for p in tmp_path.iterdir()} == chapters and {p.suffix for p in tmp_path.iterdir()} == {".ipynb"}
    assert len(done.written) == len(chapters) and not done.kept
    for path in done.written:
        nb = nbformat.read(path, as_version=4)
        assert "jupytext" not in nb.metadata, "a paired copy would be rewritten on open"
        assert nb.metadata["language_info"].get("version"), "the kernel's language_info, or opening marks it dirty"
        changes, _ = nbformat.validator.normalize(nb)
        assert changes == 0 and all(cell.get("id") for cell in nb.cells), "JupyterLab would add ids: modified"
        assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
    from jupytext.config import find_jupytext_configuration_file

    assert find_jupytext_configuration_file(str(lab.LAB_DIR)) is None, "no jupytext pairing may reach lab/"


def test_a_learners_copy_is_kept_and_fresh_replaces_it(tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copy(ROOT / "notebooks" / f"{SMALL}.py", notebooks)
    lab.prepare(tmp_path / "lab", notebooks=notebooks)
    mine = tmp_path / "lab" / f"{SMALL}.ipynb"
    nb = nbformat.read(mine, as_version=4)
    nb.cells[0].source += "\nmy notes"
    nbformat.write(nb, mine)
    again = lab.prepare(tmp_path / "lab", notebooks=notebooks)
    assert mine in again.kept and not again.written and "my notes" in mine.read_text()
    lab.prepare(tmp_path / "lab", fresh=True, notebooks=notebooks)
    assert "my notes" not in mine.read_text()


@pytest.mark.slow
@pytest.mark.torch  # runs a chapter in a kernel
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_running_a_chapter_in_the_lab_leaves_git_status_as_it_was() -> None:
    from nbclient import NotebookClient

    status, committed = _git("status", "--porcelain").stdout, _committed_notebooks()
    lab_dir = ROOT / "lab"
    created = not lab_dir.exists()
    lab.prepare(lab_dir)  # what make lab runs first; a learner's existing copies are kept
    run = lab_dir / f"{SMALL}.test-run.ipynb"
    try:
        nb = lab.lab_notebook(ROOT / "notebooks" / f"{SMALL}.py")
        first_check = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "check(" in c.source)
        nb.cells = nb.cells[: first_check + 1]
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(lab_dir)}}).execute()
        nbformat.write(nb, run)  # what JupyterLab's save does, next to the learner's copies
        html = "".join(o.get("data", {}).get("text/html", "") for o in nb.cells[first_check].outputs)
        assert '<details class="memlab-solution">' in html, "the check renders its collapsed solution"
        assert _git("check-ignore", "-q", f"lab/{SMALL}.ipynb").returncode == 0, "lab/ must be git-ignored"
        assert _git("status", "--porcelain").stdout == status, "running a lab copy changed git status"
        assert _committed_notebooks() == committed, "running a lab copy touched notebooks/"
    finally:
        run.unlink(missing_ok=True)
        if created:
            shutil.rmtree(lab_dir, ignore_errors=True)
