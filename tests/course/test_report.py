"""memlab.course.report: cache keys, failure handling, index.json, offline pages; then (slow) the real course at ci
scale,
built once, and its rendered index checked in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from memlab.course import report

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "course"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
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


def test_memlab_hash_covers_every_memlab_source_file(tmp_path: Path) -> None:
    (tmp_path / "memlab" / "sub").mkdir(parents=True)
    (tmp_path / "memlab" / "a.py").write_text("A = 1\n")
    (tmp_path / "memlab" / "sub" / "b.py").write_text("B = 1\n")
    before = report.memlab_hash(tmp_path)
    assert report.memlab_hash(tmp_path) == before, "stable"
    (tmp_path / "memlab" / "sub" / "b.py").write_text("B = 2\n")
    assert report.memlab_hash(tmp_path) != before, "a nested module's edit changes the hash"


def test_unreadable_cache_is_ignored(tmp_path: Path) -> None:
    (tmp_path / ".cache.json").write_text("{not json")
    assert report.load_cache(tmp_path / ".cache.json") == {}


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
        runs["first_page"] = (out / "index.html").read_text()
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
    assert "ZeroDivisionError" in page and 'data-status="failed"' in page


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
    assert "Solution:" in page
    assert "Solution:" not in (fixture_runs["out"] / "10_passes.html").read_text()


def test_pages_need_no_cdn(fixture_runs: dict) -> None:
    out = fixture_runs["out"]
    for page in [out / "index.html", out / "10_passes.html", out / "11_fails.html"]:
        html = page.read_text()
        assert not EXTERNAL_RESOURCE.findall(html), f"{page.name} loads something from the network"
    assert "data:image/png;base64," in (out / "10_passes.html").read_text(), "figures are embedded"


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, "--only", "99") == 2
    assert "no such chapter" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main(["--notebooks", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "no chapter notebooks" in capsys.readouterr().err


# --- the real course, built once at ci scale, checked in a real browser ------------------------------------------

@pytest.fixture(scope="session")
def course_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("course-report")
    code = report.main(["--scale", "ci", "--out", str(out), "--no-progress", "--force"])
    return code, out


@pytest.mark.slow
def test_every_real_chapter_executes_at_ci_scale(course_report: tuple[int, Path]) -> None:
    code, out = course_report
    index = _index(out)
    failures = {ch["name"]: ch["error"] for ch in index["chapters"] if ch["status"] != "ok"}
    assert code == 0 and not failures, failures
    names = [ch["name"] for ch in index["chapters"]]
    assert names == sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    for ch in index["chapters"]:
        assert ch["figures"] >= 1, f"{ch['name']} shows no figure"
        html = (out / ch["html"]).read_text()
        assert not EXTERNAL_RESOURCE.findall(html), f"{ch['name']} loads something from the network"


def _browser_or_skip():
    if not CHROMIUM.exists():
        if os.geteuid() == 0:
            pytest.fail(f"{CHROMIUM} is missing although this runs as root: `make chromium` installs it")
        pytest.skip(f"{CHROMIUM} is missing and this is not root, so it cannot be installed: "
                    "apt-get install chromium (as root) enables the browser check")
    from playwright.sync_api import sync_playwright

    return sync_playwright


@pytest.mark.slow
def test_rendered_report_in_headless_chromium(course_report: tuple[int, Path]) -> None:
    sync_playwright = _browser_or_skip()
    _, out = course_report
    index = _index(out)
    shots = out / "screenshots"
    shots.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((out / "index.html").as_uri())
            rows = page.locator("tr.chapter")
            assert rows.count() == len(index["chapters"])
            links = page.locator("tr.chapter a")
            hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
            assert hrefs == [ch["html"] for ch in index["chapters"]]
            page.screenshot(path=str(shots / "index.png"), full_page=True)
            for ch in index["chapters"]:
                page.goto((out / ch["html"]).as_uri())
                page.wait_for_load_state("load")
                assert page.title(), f"{ch['name']} has a title"
                images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
                assert len(images) >= max(1, ch["figures"]), f"{ch['name']}: figures missing"
                broken = [i for i, (complete, width) in enumerate(images) if not complete or width == 0]
                assert not broken, f"{ch['name']}: broken images {broken}"
                page.screenshot(path=str(shots / f"{ch['name']}.png"))
        finally:
            browser.close()
    assert (shots / "index.png").stat().st_size > 0
    if os.environ.get("MEMLAB_SCREENSHOT_DIR"):
        target = Path(os.environ["MEMLAB_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        for shot in shots.glob("*.png"):
            shutil.copy2(shot, target / shot.name)
