"""memlab.course.report: cache keys, failure handling, index.json, the book built offline; then (slow) the real
course at ci scale, built once (the browser test, tests/course/test_book_browser.py, reads the same build)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from memlab.course import book, pages, report

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "course"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CJK_SAMPLE = "視訊記憶體利用率"  # seed 000's title: the glyphs a CJK font must supply
WARNING_TEXT = re.compile(r"\.py:\d+: [A-Z]\w*Warning:|class=\"output stderr\"")
"""A warning as Python prints it (``file.py:12: FutureWarning: ...``) or any stderr output; a chapter may still
*discuss* a warning (chapter 03 tabulates the ones ``torch.cuda.amp`` raises)."""
OUT_DIR_ASSIGNED = re.compile(r'out_dir</span>\s*<span class="o">=</span>')  # `out_dir = ...` in a highlighted cell
EXTERNAL_RESOURCE = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//", re.I)


def _index(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def _by_name(index: dict) -> dict[str, dict]:
    return {ch["name"]: ch for ch in index["chapters"]}


def _run(out: Path, *extra: str) -> int:
    return report.main(["--notebooks", str(FIXTURES), "--out", str(out), "--no-progress", *extra])


# --- cache key ---------------------------------------------------------------------------------------------------

def test_cache_key_changes_with_notebook_code_and_parameters(tmp_path: Path) -> None:
    nb = tmp_path / "00_x.py"
    nb.write_text("x = 1\n")
    params = {"scale": "ci", "device": "cpu", "seed": 0, "out_dir": "/a"}
    key = report.cache_key(nb, "code-1", params)
    assert report.cache_key(nb, "code-1", {**params, "out_dir": "/elsewhere"}) == key, "out_dir is not an input"
    assert report.cache_key(nb, "code-2", params) != key
    assert report.cache_key(nb, "code-1", {**params, "seed": 1}) != key
    assert report.cache_key(nb, "code-1", {**params, "scale": "full"}) != key
    nb.write_text("x = 2\n")
    assert report.cache_key(nb, "code-1", params) != key


def test_cache_key_changes_with_the_installed_libraries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from memlab.predict.spec import versions

    nb = tmp_path / "00_x.py"
    nb.write_text("x = 1\n")
    params = {"scale": "ci", "device": "cpu", "seed": 0}
    key = report.cache_key(nb, "code-1", params)
    assert report.environment()["transformers"] == versions.VERIFIED["transformers"]
    monkeypatch.setattr(versions, "installed", lambda name: "9.9.9")
    assert report.cache_key(nb, "code-1", params) != key, "another transformers or torch runs the chapter again"


def test_seed_cache_copies_a_previous_reports_sound_chapters_only(tmp_path: Path) -> None:
    previous, out = tmp_path / "reports", tmp_path / "out"
    records = {}
    for name, status in (("00_a", "ok"), ("01_b", "cached"), ("02_c", "failed"), ("03_d", "ok")):
        if name != "03_d":  # 03's page source is missing: not reusable
            (previous / book.SOURCE_DIR).mkdir(parents=True, exist_ok=True)
            (previous / book.SOURCE_DIR / f"{name}.ipynb").write_text("{}")
        (previous / "build" / name).mkdir(parents=True)
        (previous / "build" / name / "ledger.csv").write_text("x\n")
        records[name] = report.ChapterResult(id=name[:2], name=name, title=name, status=status, run_time_s=1.0,
                                             html=f"{name}.html", figures=1).to_dict()
    (previous / ".cache.json").write_text(json.dumps({"version": report.CACHE_VERSION, "chapters": records}))
    out.mkdir()
    assert report.seed_cache(previous, out) == ["00_a", "01_b"]
    assert (out / "build" / "01_b" / "ledger.csv").exists() and (out / book.SOURCE_DIR / "00_a.ipynb").exists()
    assert set(report.load_cache(out / ".cache.json")) == {"00_a", "01_b"}
    assert report.seed_cache(tmp_path / "nothing-here", tmp_path / "out") == []


def test_memlab_hash_covers_every_memlab_source_file(tmp_path: Path) -> None:
    (tmp_path / "memlab" / "sub").mkdir(parents=True)
    (tmp_path / "memlab" / "a.py").write_text("A = 1\n")
    (tmp_path / "memlab" / "sub" / "b.py").write_text("B = 1\n")
    before = report.memlab_hash(tmp_path)
    assert report.memlab_hash(tmp_path) == before, "stable"
    (tmp_path / "memlab" / "sub" / "b.py").write_text("B = 2\n")
    assert report.memlab_hash(tmp_path) != before, "a nested module's edit changes the hash"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"a string"', "null", '{"version": 1, "chapters": [1]}',
                                  '{"version": 1, "chapters": {"10_x": 5}}',
                                  '{"version": 1, "chapters": {"10_x": {"name": "10_x", "bogus": 1}}}'],
                         ids=["not-json", "list", "string", "null", "chapters-list", "record-int", "record-keys"])
def test_a_damaged_cache_is_treated_as_absent_with_a_note(tmp_path: Path, text: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".cache.json").write_text(text)
    assert report.load_cache(tmp_path / ".cache.json") == {}
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "cache .cache.json is damaged" in out and "every chapter runs" in out


def test_a_missing_or_older_cache_is_absent_without_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.load_cache(tmp_path / ".cache.json") == {}
    (tmp_path / ".cache.json").write_text('{"version": 0, "chapters": {}}')
    assert report.load_cache(tmp_path / ".cache.json") == {}
    assert capsys.readouterr().out == ""



def _concurrency(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device: str, jobs: int | None,
                 last_s: list[float | None], alone: tuple[int, ...] = ()) -> tuple[int, list[str]]:
    """Most chapters running at once, and the order they started, when ``run_chapters`` executes stand-ins."""
    import threading
    import time as clock

    lock, state, started = threading.Condition(), {"now": 0, "most": 0}, []
    want = 1 if device.startswith("cuda") else (jobs or report.default_jobs())

    def fake_run_chapter(source: Path, out: Path, params: dict, **_: object) -> report.ChapterResult:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            started.append(source.stem)
            assert not (source.stem in alone_names and state["now"] > 1), f"{source.stem} ran beside another"
            lock.notify_all()
            # a stand-in stays until as many run as may (or every chapter has started, or 0.2 s after the last
            # start): on a loaded machine a fixed sleep let the first finish before the second started
            deadline = clock.monotonic() + 5.0
            while (source.stem not in alone_names and state["now"] < want and len(started) < len(runs)
                   and clock.monotonic() < deadline):
                lock.wait(0.05)
        clock.sleep(0.2)
        with lock:
            state["now"] -= 1
            lock.notify_all()
        return report.ChapterResult(id=source.stem[:2], name=source.stem, title="t", status="ok")

    monkeypatch.setattr(report, "run_chapter", fake_run_chapter)
    runs = [report._Run(f"[{i}]", tmp_path / f"{i:02d}_c.py", {}, "k", s, i in alone) for i, s in enumerate(last_s)]
    alone_names = {f"{i:02d}_c" for i in alone}
    args = report._parse(["--no-progress", *(["--jobs", str(jobs)] if jobs else [])])
    results = report.run_chapters(runs, tmp_path, args, scale="ci", device=device)
    assert sorted(r.name for r in results) == sorted(r.source.stem for r in runs)
    return state["most"], started


def test_chapters_run_side_by_side_on_a_cpu_longest_first_and_one_at_a_time_on_a_gpu(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    most, started = _concurrency(monkeypatch, tmp_path, "cpu", 2, [5.0, None, 60.0, 20.0])
    assert most == 2 and started[:2] == ["02_c", "03_c"], "the two longest last runs start first"
    most, _ = _concurrency(monkeypatch, tmp_path, "cpu", 1, [1.0, 2.0, 3.0])
    assert most == 1
    most, _ = _concurrency(monkeypatch, tmp_path, "cuda:0", 4, [1.0, 2.0, 3.0])
    assert most == 1, "two kernels on one card would share, and misreport, its memory"
    monkeypatch.setattr(report, "default_jobs", lambda: 3)
    most, _ = _concurrency(monkeypatch, tmp_path, "cpu", None, [1.0] * 6)
    assert most == 3, "by default one chapter per core"
    most, started = _concurrency(monkeypatch, tmp_path, "cpu", 2, [1.0, 9.0, 2.0, 3.0], alone=(0, 2))
    assert most == 2 and started[:2] == ["02_c", "00_c"], "a chapter that times the machine runs first, alone"


def test_the_chapters_that_time_this_machine_say_so_in_their_header() -> None:
    timed = {p.stem for p in report.find_notebooks(ROOT / "notebooks") if report.runs_alone(p)}
    assert {"00_your_machine", "08_roofline_mfu", "09_nvidia_smi"} <= timed
    assert not report.runs_alone(FIXTURES / "10_passes.py")


def machine_paths_in(text: str, *extra: Path) -> list[str]:
    """Absolute paths of the build machine found in ``text``: the repository, the report, Python, tmp, home."""
    candidates = {str(ROOT), sys.prefix, sys.base_prefix, tempfile.gettempdir() + "/", str(Path.home()) + "/",
                  *(str(p) for p in extra)}
    return sorted(c for c in candidates if len(c) > 2 and c in text)


def test_ledger_summary_says_what_was_compared_and_names_no_worst_when_all_agree(tmp_path: Path) -> None:
    import pandas as pd

    pd.DataFrame({"experiment": ["a", "a", "b"], "component": ["params", "grads", "params"], "unit": "B",
                  "rel_error": [0.0, 0.0, -0.0]}).to_csv(tmp_path / "ledger.csv", index=False)
    summary = report.ledger_summary(tmp_path / "ledger.csv")
    assert summary["max_abs_rel_error"] == 0 and summary["worst_component"] is None
    assert summary["compared"] == "params, grads (B) in 2 experiments"
    assert [k["kind"] for k in summary["kinds"]] == ["prediction"] and "exact" in summary["kinds"][0]["figure"]


def test_ledger_summary_words_bounds_and_contrasts_as_what_they_are(tmp_path: Path) -> None:
    import pandas as pd

    pd.DataFrame({"experiment": ["roof", "roof", "rss", "fit"], "component": ["a", "b", "s", "params"],
                  "unit": ["FLOP/s", "FLOP/s", "B", "B"], "predicted": [100.0, 200.0, 10.0, 110.0],
                  "measured": [50.0, 50.0, 30.0, 100.0], "rel_error": [1.0, 3.0, -2 / 3, 0.1],
                  "kind": ["bound", "bound", "contrast", None]}).to_csv(tmp_path / "ledger.csv", index=False)
    summary = report.ledger_summary(tmp_path / "ledger.csv")
    assert summary["median_abs_rel_error"] == pytest.approx(0.1), "bounds and contrasts are not prediction errors"
    kinds = {k["kind"]: k for k in summary["kinds"]}
    assert kinds["bound"]["figure"] == "median 38% of the bound reached (lowest 25%, highest 50%)"
    assert kinds["contrast"]["figure"].startswith("measured / compared: median 3.00×")
    assert kinds["prediction"]["figure"].startswith("median |error| 10.0 %")


@pytest.mark.parametrize(("fraction", "shown"), [
    (None, "n/a"), (0.0, "0 % (exact)"), (1e-4, "0.01 %"), (1e-9, "< 0.0001 %"), (0.1234, "12.3 %"),
])
def test_percentages_in_the_index_never_round_an_error_to_zero(fraction: float | None, shown: str) -> None:
    assert book.pct(fraction) == shown


def test_chapters_table_lists_every_present_chapter_and_plans_the_rest() -> None:
    numbers = [number for number, _, _ in report.CHAPTERS]
    assert numbers == sorted(set(numbers)) and numbers[0] == "00"
    present = [p.name[:2] for p in report.find_notebooks(ROOT / "notebooks")]
    assert set(present) <= set(numbers), "a chapter in notebooks/ is missing from report.CHAPTERS"
    planned = report.planned_chapters(present, ROOT / "notebooks")
    assert sorted([p.id for p in planned] + present) == numbers
    assert all(p.status == "planned" and p.title for p in planned)
    assert report.planned_chapters([], FIXTURES) == [], "a test course has no plan"


def test_build_page_shows_planned_chapters_provenance_and_what_each_figure_means() -> None:
    index = {"title": "t", "ok": True, "complete": True, "scale": "ci", "scale_requested": "auto",
             "provenance": {"device": "cpu", "device_kind": "cpu", "os": "Linux 6.1 (x86_64)",
                            "host_memory_bytes": 25276510208, "libraries": {"torch": "2.13.0", "pandas": "2.2"},
                            "hardware_table": "abc123def456", "memlab_dirty": True, "memlab_commit": "c0ffee",
                            "recorded_gpu_data": {}, "seed": 0},
             "chapters": [
                 {"id": "00", "name": "00_a", "title": "A", "status": "ok", "run_time_s": 1.0, "html": "00_a.html",
                  "figures": 1, "ledger": {"kinds": [{"kind": "bound", "meaning": "measurement vs an upper bound",
                                                      "compared": "matmul (FLOP/s)", "rows": 1234,
                                                      "figure": "median 50% of the bound reached"}]}},
                 {"id": "01", "name": "01_b", "title": "B", "status": "planned"}]}
    page = book.build_markdown(index)
    for text in ("Linux 6.1", "23.54 GiB", "torch 2.13.0", "abc123def456", "uncommitted", "none (no page shows",
                 "measurement vs an upper bound", "median 50% of the bound reached", "1,234",
                 "planned, not written yet", "{doc}`A <00_a>`"):
        assert text in page, text
    assert "{doc}`B" not in page, "a planned chapter has no page to link"


def test_write_atomic_leaves_the_old_file_when_a_write_fails(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "page.html"
    pages.write_atomic(target, "old page")
    real_fdopen = os.fdopen

    class HalfThenFull:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text: str) -> None:
            self.handle.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pages.os, "fdopen", lambda fd, *a, **k: HalfThenFull(real_fdopen(fd, *a, **k)))
    with pytest.raises(OSError, match="No space"):
        pages.write_atomic(target, "new page " * 1000)
    assert target.read_text() == "old page"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"], "no temporary file is left behind"


def _no_book(out: Path, index: dict, notebooks_dir: Path, *, solutions: bool) -> book.SiteBuild:
    """A stand-in for :func:`report.build_book` where a test is about something else (1-2 s of Sphinx saved)."""
    return book.SiteBuild(status=0, warnings="", seconds=0.0)


def _disk_full_after(monkeypatch: pytest.MonkeyPatch, matches) -> None:
    """Make every atomic write whose target ``matches`` write half its text and fail as a full disk would."""
    real = pages.write_atomic

    def failing(path, text):
        if matches(Path(path)):
            Path(path).with_suffix(".partial").write_text(text[: len(text) // 2])  # what a disk takes before ENOSPC
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text)

    monkeypatch.setattr(pages, "write_atomic", failing)
    monkeypatch.setattr(report, "write_atomic", failing)
    monkeypatch.setattr(book, "write_atomic", failing)
    monkeypatch.setattr(report, "memlab_hash", lambda root=ROOT: "fixed")


def test_a_full_disk_while_writing_a_page_fails_that_chapter(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _disk_full_after(monkeypatch, lambda p: p.name == "10_passes.ipynb" and p.parent.name == "_book")
    assert _run(tmp_path, "--only", "10") == 1
    index = _index(tmp_path)
    chapter = _by_name(index)["10_passes"]
    assert index["ok"] is False and chapter["status"] == "failed" and chapter["html"] is None
    assert "No space" in chapter["error"]["evalue"]
    assert not (tmp_path / "10_passes.html").exists(), "no page from a truncated source"


@pytest.mark.wide  # make bench; the full disk while writing a page stays in make test
def test_a_full_disk_while_writing_the_index_leaves_no_ok_index(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "memlab_hash", lambda root=ROOT: "fixed")
        mp.setattr(report, "build_book", _no_book)  # this test is about the index; the book is tested elsewhere
        assert _run(tmp_path, "--only", "10") == 0 or _index(tmp_path)["chapters"]
    calls = []

    def final_index(path: Path) -> bool:
        calls.append(path.name)
        return path.name == "index.json" and calls.count("index.json") == 2  # the in-progress index succeeds
    _disk_full_after(monkeypatch, final_index)
    assert _run(tmp_path, "--only", "10", "--force") == 1
    assert "cannot write the report" in capsys.readouterr().err
    index = _index(tmp_path)
    assert index["ok"] is False and index["complete"] is False, "an interrupted build never reads as ok"
    assert "being built" in (tmp_path / "index.html").read_text()


def test_ledger_summary_skips_undefined_errors_and_names_the_worst(tmp_path: Path) -> None:
    import pandas as pd

    pd.DataFrame({"experiment": ["a", "b", "c", "d"], "component": ["params", "grads", "ctx", "acts"],
                  "rel_error": [0.1, -0.3, float("inf"), None]}).to_csv(tmp_path / "ledger.csv", index=False)
    summary = report.ledger_summary(tmp_path / "ledger.csv")
    assert summary["rows"] == 4
    assert summary["max_abs_rel_error"] == pytest.approx(0.3) and summary["median_abs_rel_error"] == pytest.approx(0.2)
    assert summary["worst_component"] == "b: grads"
    assert report.ledger_summary(tmp_path / "absent.csv") is None


# --- fixture course: one passing chapter, one failing ------------------------------------------------------------

@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the fixture course four ways with a fixed memlab hash (others may edit memlab/ meanwhile)."""
    out = tmp_path_factory.mktemp("fixture-report")
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "memlab_hash", lambda root=ROOT: "fixed")
        runs["first"] = (_run(out), _index(out))
        runs["first_page"] = (out / "build.html").read_text()
        with pytest.MonkeyPatch.context() as no_book:  # what "again" tests is the cache; "force" rebuilds the book
            no_book.setattr(report, "build_book", _no_book)
            runs["again"] = (_run(out), _index(out))
        runs["force"] = (_run(out, "--force", "--only", "10"), _index(out))
        runs["solutions"] = (_run(out, "--solutions", "--only", "10"), _index(out / "solutions"))
    runs["out"] = out
    return runs


def test_a_failing_chapter_does_not_stop_the_others_and_the_run_fails(fixture_runs: dict) -> None:
    code, index = fixture_runs["first"]
    assert code == 1 and index["ok"] is False
    chapters = _by_name(index)
    assert list(chapters) == ["10_passes", "11_fails"]
    assert chapters["10_passes"]["status"] == "ok" and chapters["10_passes"]["figures"] == 1
    failed = chapters["11_fails"]
    assert failed["status"] == "failed"
    assert failed["error"]["ename"] == "ZeroDivisionError" and "division by zero" in failed["error"]["evalue"]
    assert "1 / 0" in failed["error"]["source_head"]
    page = fixture_runs["first_page"]
    assert "11_fails" in page and "failed (the page shows the error)" in page


def test_index_json_carries_provenance_and_the_ledger_summary(fixture_runs: dict) -> None:
    _, index = fixture_runs["first"]
    prov = index["provenance"]
    for field in ("device", "device_kind", "peak_source", "driver", "torch", "python", "memlab_commit",
                  "memlab_dirty", "date", "scale", "seed"):
        assert field in prov, field
    assert index["scale"] == prov["scale"] and index["scale_requested"] == "auto"
    if prov["device_kind"] == "cpu":
        assert index["scale"] == "ci", "auto means ci on a CPU"
    ledger = _by_name(index)["10_passes"]["ledger"]
    # the fixture predicts 110 for a measured 100: +10 %
    assert ledger["rows"] == 1 and ledger["median_abs_rel_error"] == pytest.approx(0.1)
    assert ledger["worst_component"] == "fixture: params"


def test_unchanged_chapters_are_cached_and_failed_ones_rerun(fixture_runs: dict) -> None:
    code, index = fixture_runs["again"]
    chapters = _by_name(index)
    assert chapters["10_passes"]["status"] == "cached"
    assert chapters["10_passes"]["ledger"]["rows"] == 1, "a cached chapter keeps its ledger summary"
    assert chapters["11_fails"]["status"] == "failed" and code == 1


def test_force_reruns_the_chosen_chapter(fixture_runs: dict) -> None:
    _, index = fixture_runs["force"]
    chapters = _by_name(index)
    assert chapters["10_passes"]["status"] == "ok"
    assert chapters["11_fails"]["status"] == "not run", "a failed chapter outside --only is not reused"


def test_solutions_are_rendered_into_their_own_folder(fixture_runs: dict) -> None:
    code, index = fixture_runs["solutions"]
    assert code == 0 and index["solutions"] is True
    page = (fixture_runs["out"] / "solutions" / "10_passes.html").read_text()
    opened = r'<details class="memlab-solution" open(="")?>'  # an HTML serializer may write open=""
    assert re.search(opened, page), "the instructor's build opens the solutions"
    plain = (fixture_runs["out"] / "10_passes.html").read_text()
    assert '<details class="memlab-solution">' in plain and not re.search(opened, plain), "collapsed for learners"
    assert "instructor build" in (fixture_runs["out"] / "solutions" / "index.html").read_text()


def _pages(out: Path) -> list[Path]:
    return sorted(out.glob("*.html"))


def test_the_book_has_its_pages_and_needs_no_network(fixture_runs: dict) -> None:
    out = fixture_runs["out"]
    names = {p.name for p in _pages(out)}
    assert {"index.html", "10_passes.html", "11_fails.html", "glossary.html", "references.html", "seeds.html",
            "seed-claims.html", "build.html", "search.html"} <= names
    for page in _pages(out):
        html = page.read_text()
        assert not EXTERNAL_RESOURCE.findall(html), f"{page.name} loads something from the network"
    figure = re.findall(r'<img[^>]+src="(_images/[^"]+\.png)"', (out / "10_passes.html").read_text())
    assert figure and (out / figure[0]).stat().st_size > 0, "the figure is a file of the book"
    assert "ZeroDivisionError" in (out / "11_fails.html").read_text(), "a failed chapter's page shows its error"


def test_pages_show_no_parameters_cell_and_no_machine_path(fixture_runs: dict) -> None:
    out = fixture_runs["out"]
    for page in _pages(out):
        html = page.read_text()
        assert not machine_paths_in(html, out), f"{page.name} shows a path of this machine"
    html = (out / "10_passes.html").read_text()
    assert not OUT_DIR_ASSIGNED.findall(html) and "injected" not in html.lower(), "no parameters cell"
    assert "PosixPath" not in html, "a returned path is plumbing, not content"


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, "--only", "99") == 2
    assert "no such chapter" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main(["--notebooks", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "no chapter notebooks" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--bogus"], ["--scale", "huge"], ["--seed", "x"], ["--timeout", "0"],
                                  ["--jobs", "0"], ["--only"]],
                         ids=["unknown-flag", "bad-scale", "bad-seed", "zero-timeout", "zero-jobs", "missing-value"])
def test_bad_flags_are_one_error_line_not_a_usage_dump(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlab: error: ") and "usage" not in captured.err, captured.err
    assert "python -m memlab.course.report --help" in lines[0] and captured.out == ""


def _no_network_prefix() -> list[str]:
    """A command prefix running its command in a network namespace of its own with only a loopback (the kernel
    talks to papermill over it): nothing outside the machine is reachable. [] where that is not available."""
    import subprocess

    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        return []
    prefix = [unshare, "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]
    return prefix if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0 else []


def test_a_run_with_no_network_builds_the_book_and_shows_no_kernel_start_up_warning(tmp_path: Path) -> None:
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*_no_network_prefix(), sys.executable, "-m", "memlab.course.report", "--notebooks",
                           str(FIXTURES), "--out", str(tmp_path), "--no-progress", "--only", "11"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == ["report: failed chapter(s): 11_fails; their pages show the error"]
    assert "book: built in" in proc.stdout and (tmp_path / "11_fails.html").exists(), proc.stdout[-2000:]
    assert "11_fails" in (tmp_path / "index.html").read_text()


# --- the real course, built once at ci scale, checked in a real browser ------------------------------------------

@pytest.fixture(scope="session")
def course_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The real course at ci scale, built once into a temporary folder. A chapter that `make report` (reports/)
    already ran with this very notebook, memlab source, parameters and environment (its cache key) is reused, as
    `make report` itself reuses it; every other chapter executes (all of them on a clean clone, as in CI)."""
    out = tmp_path_factory.mktemp("course-report")
    report.seed_cache(ROOT / "reports", out)
    code = report.main(["--scale", "ci", "--out", str(out), "--no-progress"])
    return code, out


@pytest.mark.slow
def test_every_real_chapter_executes_at_ci_scale(course_report: tuple[int, Path]) -> None:
    code, out = course_report
    index = _index(out)
    run = [ch for ch in index["chapters"] if ch["status"] != "planned"]
    failures = {ch["name"]: ch["error"] for ch in run if ch["status"] not in ("ok", "cached")}
    assert code == 0 and not failures, failures
    assert [ch["name"] for ch in run] == sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    assert len(index["chapters"]) == len(report.CHAPTERS), "planned chapters are listed too"
    assert index["book"]["status"] == 0 and index["book"]["seconds"] < 60, index["book"]
    warnings = (out / "build" / "book-warnings.log")
    assert not warnings.exists() or not warnings.read_text().strip(), warnings.read_text()
    for page in _pages(out):
        html = page.read_text()
        assert not EXTERNAL_RESOURCE.findall(html), f"{page.name} loads something from the network"
        assert not machine_paths_in(html, out), f"{page.name} shows a path of this machine"
        assert not WARNING_TEXT.findall(html), f"{page.name} shows warning or stderr text"
    for ch in run:
        assert ch["figures"] >= 1, f"{ch['name']} shows no figure"
        html = (out / ch["html"]).read_text()
        assert "injected-parameters" not in html and not OUT_DIR_ASSIGNED.findall(html), ch["name"]


@pytest.mark.slow
def test_no_figure_label_or_legend_overlaps_another_or_its_data(course_report: tuple[int, Path]) -> None:
    """Measured when each figure was saved (memlab.course.figures, from the figure's own text extents)."""
    from memlab.course.figures import FIGURE_CHECKS

    _, out = course_report
    checks = {p.parent.name: json.loads(p.read_text()) for p in (out / "build").glob(f"*/{FIGURE_CHECKS}")}
    assert checks, "save_figure records its checks"
    overlaps = {f"{chapter}/{fig}": found for chapter, figs in checks.items() for fig, found in figs.items() if found}
    assert not overlaps, overlaps


def _browser_or_skip():
    if not CHROMIUM.exists():
        if os.geteuid() == 0:
            pytest.fail(f"{CHROMIUM} is missing although this runs as root: `make chromium` installs it")
        pytest.skip(f"{CHROMIUM} is missing and this is not root, so it cannot be installed: "
                    "apt-get install chromium (as root) enables the browser check")
    from playwright.sync_api import sync_playwright

    return sync_playwright


MISSING_GLYPHS = """(chars) => {
  // Each character drawn in the page's font next to an unassigned code point (U+0378), whose drawing is the
  // font's 'missing glyph' box: a character drawn exactly like it has no glyph here.
  const font = "32px " + getComputedStyle(document.body).fontFamily;
  const draw = (c) => {
    const canvas = document.createElement("canvas"); canvas.width = 48; canvas.height = 48;
    const ctx = canvas.getContext("2d"); ctx.font = font; ctx.fillText(c, 4, 36);
    return Array.from(ctx.getImageData(0, 0, 48, 48).data).join(",");
  };
  const box = draw("\\u0378");
  return Array.from(chars).filter((c) => draw(c) === box).join("");
}"""


def test_missing_glyph_check_sees_boxes() -> None:
    sync_playwright = _browser_or_skip()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_content("<p>x</p>")
            assert page.evaluate(MISSING_GLYPHS, "\u0379") == "\u0379", "an unassigned code point is a box"
            assert page.evaluate(MISSING_GLYPHS, "ab") == "", "Latin letters have glyphs"
        finally:
            browser.close()


LEARNER_TEXT = {
    "a path repr": re.compile(r"(?:Posix|Windows)Path\("),
    "a traceback": re.compile(r"Traceback \(most recent call last\)"),
    "a warning": re.compile(r"\b\w*Warning: "),
    "a config dump": re.compile(r"\{'scale': '"),
    "a figure repr": re.compile(r"<(?:Figure|Axes)[ :]\w*"),
    "the parameters cell": re.compile(r"injected-parameters|out_dir = "),
}
"""Plumbing that must not appear in a page's visible text."""
LEARNER_CELLS = {
    "NaN": re.compile(r"^(?:NaN|nan|NaT|<NA>)$"),
    "None": re.compile(r"^None$"),
    "scientific notation": re.compile(r"\d[eE][+-]\d{2}\b"),
    "a cut cell": re.compile(r"\.\.\.$|…$"),
}
"""What a table cell must not be (or end with)."""
CODE_NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
"""A table header that is a snake_case identifier (``peak_bytes``): a reader's header says "peak (GiB)"
(:func:`memlab.course.chapter.reader_columns`)."""
SCIENTIFIC = re.compile(r"\b\d+(?:\.\d+)?[eE][+-]?\d+\b")
"""e-notation (``6.1e-5``, ``1e12``) in a page's prose or outputs (code excluded): a reader's page writes 6.1 × 10⁻⁵."""
PAGE_FACTS = r"""() => {
  const article = document.querySelector("article") || document.body;
  const cells = Array.from(article.querySelectorAll("table td, table th")).map(c => c.innerText.trim());
  const headers = Array.from(article.querySelectorAll("table thead th")).map(c => c.innerText.trim());
  const plain = Array.from(article.querySelectorAll(".cell_output .output.text_plain pre, .cell_output pre"))
    .map(p => p.innerText.trim()).filter(t => /^'.*'$|^".*"$/s.test(t));
  const images = Array.from(document.images).map(i => [i.getAttribute("src"), i.complete, i.naturalWidth]);
  const wide = Array.from(article.querySelectorAll("table")).filter(t => t.getBoundingClientRect().right >
    article.getBoundingClientRect().right + 2 && getComputedStyle(t).overflowX !== "auto"
    && getComputedStyle(t.parentElement).overflowX !== "auto").length;
  const bare = article.cloneNode(true);
  // exercise feedback (.memlab-exercise) is the exercises' own text, checked by their tests, not here
  bare.querySelectorAll("pre, code, .cell_input, script, style, .memlab-exercise").forEach(e => e.remove());
  // at the test's width (1024 px): a printed output must fit its box (outputs wrap); a table fits or scrolls in
  // its own box (overflow-x auto), never cut by the page
  const owns = (e) => ["auto", "scroll"].includes(getComputedStyle(e).overflowX);
  const cut = Array.from(article.querySelectorAll(".cell_output pre, table"))
    .filter(e => e.scrollWidth > e.clientWidth + 1 && !(e.tagName === "TABLE" && owns(e)))
    .map(e => e.innerText.trim().split("\n")[0].slice(0, 80));
  // predict-first: the cell tagged reveals-NAME (its measurement) must not come above the check of NAME
  const cellsOf = (name) => Array.from(article.querySelectorAll(".cell"))
    .filter(c => c.classList.contains("tag_reveals-" + name));
  const predictFirst = Array.from(article.querySelectorAll(".memlab-exercise[data-predict-first]")).map(ex => {
    const reveals = cellsOf(ex.dataset.exercise);
    return {name: ex.dataset.exercise, marked: reveals.length,
            above: reveals.filter(c => c.compareDocumentPosition(ex) & Node.DOCUMENT_POSITION_FOLLOWING).length};
  });
  const tables = Array.from(article.querySelectorAll("table")).map(t => ({
    headers: Array.from(t.querySelectorAll("thead tr:first-child th")).map(h => h.innerText.trim()),
    rows: Array.from(t.querySelectorAll("tbody tr")).slice(0, 20)
      .map(r => Array.from(r.children).map(c => c.innerText.trim()))}));
  return {text: article.innerText, prose: bare.textContent, cells, headers, quoted: plain, images, wide,
          cut, predict_first: predictFirst, tables,
          stderr: article.querySelectorAll(".output.stderr").length,
          solutions: Array.from(article.querySelectorAll("details.memlab-solution")).map(d => d.open),
          exercises: (article.innerText.match(/Exercise \d/g) || []).length};
}"""


UNIT = re.compile(r"(?<![\w/])(TiB|GiB|MiB|KiB|TB|GB|MB|kB|B|bytes|%|ms|µs|s|[TGM]?FLOP/s|FLOPs?|tokens/s)"
                  r"(?![\w/])")
"""A unit named in a table header: "peak (MiB)", "peak GiB", "time (s)"."""
NUMBER = re.compile(r"^[-−+]?[\d,.]+(?:\s*[×x]\s*10[⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+)?$")


RATIO = re.compile(r" / | vs |ratio|error|×", re.I)
"""A header naming a ratio of two quantities ("measured / predicted", "relative error (%)"): no compared quantity."""


def _unit(header: str) -> str:
    found = UNIT.findall(header)
    return {"bytes": "B"}.get(found[-1], found[-1]) if found else "no unit"


def _numeric_column(rows: list[list[str]], i: int) -> bool:
    cells = [r[i] for r in rows if len(r) > i and r[i] not in ("", "—")]
    return bool(cells) and all(NUMBER.match(c) for c in cells)


def mixed_unit_tables(tables: list[dict]) -> list[str]:
    """The predicted-vs-measured tables whose compared columns are not in one unit, one line each.

    A table qualifies when one numeric column's header says "predicted" and another's says "measured" or "peak"
    (what the learner met: "peak (MiB)" beside "predicted" in raw bytes); those columns must all name the same unit
    (or all none: counts, such as a batch). A ratio's column (:data:`RATIO`) is not one of them."""
    bad = []
    for table in tables:
        headers, rows = table["headers"], table["rows"]
        offset = max(len(r) for r in rows) - len(headers) if rows else 0  # an index header row may be shorter
        compared = [(h, _unit(h)) for i, h in enumerate(headers)
                    if re.search(r"predicted|measured|peak", h, re.I) and not RATIO.search(h)
                    and _numeric_column(rows, i + offset)]
        if not any(re.search("predicted", h, re.I) for h, _ in compared) or len(compared) < 2:
            continue
        if len({u for _, u in compared}) > 1:
            bad.append(", ".join(f"{h!r}: {u}" for h, u in compared))
    return bad


NEW_CHECKS_PENDING: dict[str, dict[str, str]] = {
}
"""Chapters that still fail one of the learner's checks of issue 37 (cut output, a predict-first answer above its
check, a predicted-vs-measured table in two units), by check and page: the chapter's fix is pending, so the
browser test xfails naming them; any other page failing these checks fails the test."""


def learner_layout_problems(facts: dict) -> dict[str, list[str]]:
    """The learner's layout and exercise-order checks a page fails, by check (from :data:`PAGE_FACTS`)."""
    found = {
        "cut at 1024 px": facts.get("cut", []),
        "a predict-first answer above its check": [e["name"] for e in facts.get("predict_first", []) if e["above"]],
        "a predict-first exercise without its measuring cell (tag reveals-NAME)":
            [e["name"] for e in facts.get("predict_first", []) if not e["marked"]],
        "a predicted-vs-measured table in two units": mixed_unit_tables(facts.get("tables", [])),
    }
    return {check: items for check, items in found.items() if items}


def learner_grade_problems(facts: dict) -> list[str]:
    """The learner-grade rules a page breaks, from :data:`PAGE_FACTS` (one line each)."""
    problems = [f"shows {what}: {m.group(0)!r}" for what, rx in LEARNER_TEXT.items()
                if (m := rx.search(facts["text"]))]
    if m := SCIENTIFIC.search(facts.get("prose", "")):
        problems.append(f"scientific notation in the text: {m.group(0)!r}")
    for what, rx in LEARNER_CELLS.items():
        bad = [c for c in facts["cells"] if rx.search(c)]
        if bad:
            problems.append(f"{len(bad)} table cell(s) with {what}, e.g. {bad[0]!r}")
    code_named = [h for h in facts.get("headers", []) if CODE_NAME.match(h)]
    if code_named:
        problems.append(f"{len(code_named)} column name(s) written as code, not a header with its unit, e.g. "
                        f"{code_named[0]!r}")
    if facts["quoted"]:
        problems.append(f"a quoted string as a cell's value: {facts['quoted'][0][:60]!r}")
    if facts["stderr"]:
        problems.append(f"{facts['stderr']} stderr block(s)")
    if facts["wide"]:
        problems.append(f"{facts['wide']} table(s) wider than the page that do not scroll")
    broken = [src for src, complete, width in facts["images"] if not complete or not width]
    if broken:
        problems.append(f"broken image(s) {broken[:3]}")
    return problems


def test_learner_grade_rules_catch_plumbing() -> None:
    clean = {"text": "MFU is 42 %.", "cells": ["1,024", "12.5 %"], "quoted": [], "stderr": 0, "wide": 0,
             "images": [["_images/a.png", True, 640]]}
    assert learner_grade_problems(clean) == []
    dirty = {**clean, "text": "PosixPath('x') FutureWarning: old", "cells": ["NaN", "5.42e-05", "None"],
             "quoted": ["'No GPU run'"], "stderr": 1, "images": [["_images/b.png", True, 0]],
             "prose": "about 6.1e-5 of them", "headers": ["peak_bytes", "peak (GiB)"]}
    assert len(learner_grade_problems(dirty)) == 10


def test_learner_layout_rules_catch_cut_outputs_late_questions_and_mixed_units() -> None:
    assert learner_layout_problems({"cut": [], "predict_first": [{"name": "00.x", "marked": 1, "above": 0}],
                                    "tables": []}) == {}
    one_unit = {"headers": ["", "predicted (MiB)", "measured (MiB)"], "rows": [["a", "2.74", "2.74"]]}
    two_units = {"headers": ["batch", "peak (MiB)", "predicted (sum of components)"],
                 "rows": [["1", "2.74", "3,211,268"]]}
    counts = {"headers": ["fit search predicted batch", "measured batch", "peak phase"], "rows": [["5", "5", "fwd"]]}
    ratio = {"headers": ["predicted (s)", "measured / predicted"], "rows": [["1.5", "0.9"]]}
    assert mixed_unit_tables([one_unit, counts, ratio]) == []
    assert mixed_unit_tables([two_units]) == ["'peak (MiB)': MiB, 'predicted (sum of components)': no unit"]
    found = learner_layout_problems({"cut": ["the first case as an OOM message"],
                                     "predict_first": [{"name": "01.y", "marked": 1, "above": 1},
                                                       {"name": "01.z", "marked": 0, "above": 0}],
                                     "tables": [two_units]})
    assert len(found) == 4 and found["a predict-first answer above its check"] == ["01.y"]


def _offline_browser(pw):
    """Chromium with every request that is not a file:// URL aborted and recorded (the test fails on any)."""
    browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
    context = browser.new_context(viewport={"width": 1024, "height": 900}, service_workers="block")
    outside: list[str] = []

    def route(r):
        if r.request.url.startswith(("file://", "data:", "about:")):
            return r.continue_()
        outside.append(r.request.url)
        return r.abort()
    context.route("**/*", route)
    return browser, context, outside


@pytest.mark.slow
def test_every_page_of_the_book_offline_in_headless_chromium(course_report: tuple[int, Path]) -> None:
    sync_playwright = _browser_or_skip()
    _, out = course_report
    index = _index(out)
    shots = out / "screenshots"
    shots.mkdir(exist_ok=True)
    problems: dict[str, list[str]] = {}
    layout: dict[str, dict[str, list[str]]] = {}
    solution_blocks: dict[str, list[bool]] = {}
    with sync_playwright() as pw:
        browser, context, outside = _offline_browser(pw)
        try:
            page = context.new_page()
            page.set_content(f"<p>{CJK_SAMPLE}</p>")
            assert not page.evaluate(MISSING_GLYPHS, CJK_SAMPLE), (
                "CJK glyphs render as boxes: install a CJK font (make chromium installs fonts-noto-cjk)")
            page.goto((out / "index.html").as_uri())
            sidebar = page.locator("nav.bd-links a.reference")
            linked = {sidebar.nth(i).get_attribute("href") for i in range(sidebar.count())}
            assert {ch["html"] for ch in index["chapters"] if ch.get("html")} <= linked, "every chapter in the sidebar"
            assert page.locator("text=Start here").count() and page.locator("text=the belief it checks").count()
            page.screenshot(path=str(shots / "index.png"), full_page=True)
            for path in _pages(out):
                page.goto(path.as_uri())
                page.wait_for_load_state("load")
                assert page.title(), f"{path.name} has a title"
                facts = page.evaluate(PAGE_FACTS)
                if found := learner_grade_problems(facts):
                    problems[path.name] = found
                for check, items in learner_layout_problems(facts).items():
                    layout.setdefault(check, {})[path.stem] = items
                cjk = "".join(sorted(set(re.findall(r"[\u3000-\u9fff\uf900-\ufaff]", facts["text"]))))
                missing = page.evaluate(MISSING_GLYPHS, cjk) if cjk else ""
                assert not missing, f"{path.name}: no glyph for {missing!r} (boxes): install a CJK font"
                if facts["exercises"]:
                    solution_blocks[path.name] = facts["solutions"]
                if path.stem[:2].isdigit():
                    page.screenshot(path=str(shots / f"{path.stem}.png"))
                    nav = page.locator("a.right-next, a.left-prev")
                    assert nav.count() >= 1, f"{path.name} has no previous/next link"
            page.goto((out / "index.html").as_uri())
            assert page.locator("a.right-next").get_attribute("href") == _pages_in_order(index)[0], (
                "the landing's Next is the chapter 'Start here' names")
            _search_shows_excerpts_from_disk(page, out, "fragmentation")
        finally:
            browser.close()
    assert not outside, f"pages asked the network for {sorted(set(outside))[:5]}"
    assert not problems, problems
    if os.environ.get("MEMLAB_SCREENSHOT_DIR"):
        target = Path(os.environ["MEMLAB_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        for shot in shots.glob("*.png"):
            shutil.copy2(shot, target / shot.name)
    _solution_blocks_are_collapsed(solution_blocks)
    _layout_checks_pass_or_are_pending(layout)


def _pages_in_order(index: dict) -> list[str]:
    return [ch["html"] for ch in index["chapters"] if ch.get("html")]


def _search_shows_excerpts_from_disk(page, out: Path, query: str) -> None:
    """Sphinx's search from file://: results, each with an excerpt (the page texts ship inline: the browser refuses
    the fetch Sphinx makes for an excerpt under file://), and a glossary hit named by its term."""
    page.goto((out / "search.html").as_uri() + f"?q={query}")
    page.wait_for_selector("#search-results li p.context", timeout=15000)
    items = page.locator("#search-results li")
    assert items.count() >= 1, "full-text search finds a chapter"
    page.wait_for_timeout(300)
    texts = [items.nth(i).inner_text() for i in range(items.count())]
    assert all("\n" in t.strip() for t in texts), f"every result has an excerpt: {texts[:3]}"
    titles = [t.split("\n")[0] for t in texts]
    assert len(titles) == len(set(titles)), f"a page listed twice under one title: {titles}"


def _layout_checks_pass_or_are_pending(layout: dict[str, dict[str, list[str]]]) -> None:
    unexpected = {check: {page: items for page, items in pages.items()
                          if page not in NEW_CHECKS_PENDING.get(check, {})}
                  for check, pages in layout.items()}
    unexpected = {check: pages for check, pages in unexpected.items() if pages}
    assert not unexpected, unexpected
    if layout:
        pytest.xfail("pending in the chapters: " + "; ".join(
            f"{check}: {', '.join(f'{page} ({NEW_CHECKS_PENDING[check][page]})' for page in pages)}"
            for check, pages in layout.items()))


def _solution_blocks_are_collapsed(blocks: dict[str, list[bool]]) -> None:
    if not any(blocks.values()):
        pytest.xfail("no exercise shows a <details class='memlab-solution'> block yet (the exercises branch adds "
                     "them); this check turns on when it merges")
    assert all(blocks.values()), f"a chapter with exercises has no solution block: {blocks}"
    opened = {name: found for name, found in blocks.items() if any(found)}
    assert not opened, f"solutions shown open in the learner's book: {opened}"


@pytest.mark.slow
def test_the_solutions_book_opens_every_solution_block(fixture_runs: dict) -> None:
    sync_playwright = _browser_or_skip()
    with sync_playwright() as pw:
        browser, context, outside = _offline_browser(pw)
        try:
            page = context.new_page()
            found = {}
            for build in (fixture_runs["out"], fixture_runs["out"] / "solutions"):
                page.goto((build / "10_passes.html").as_uri())
                found[build.name] = page.evaluate(PAGE_FACTS)["solutions"]
        finally:
            browser.close()
    assert not outside
    if not any(found.values()):
        pytest.xfail("the fixture's exercise shows no <details class='memlab-solution'> block yet (the exercises "
                     "branch adds it)")
    learner = found[fixture_runs["out"].name]
    assert found["solutions"] and all(found["solutions"]), f"the instructor's book opens every block: {found}"
    assert learner and not any(learner), f"the learner's book has the blocks, collapsed: {found}"

