"""The guard (issue 32, point 3): a formula answer under a transformers, torch or peft release its family terms were
not verified against says so in one line, and ``memlab estimate --hf`` answers from the trace of the installed code,
the formula's number beside it. The installed version is faked."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from memlab import cli
from memlab.predict.families.reader import from_hf
from memlab.predict.spec import versions

TINY = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny"


@pytest.fixture
def newer_transformers(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """transformers reported as 5.99.0, the others as installed."""
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda name: "5.99.0" if name == "transformers" else real(name))
    versions.unverified.cache_clear()
    yield "transformers 5.99.0 (verified: 5.25.0)"
    versions.unverified.cache_clear()


def _tiny(family: str) -> dict:
    return {k: v for k, v in json.loads((TINY / f"{family}.json").read_text()).items() if not k.startswith("_")}


def test_the_locked_releases_are_the_verified_ones_and_give_no_warning() -> None:
    versions.unverified.cache_clear()
    assert versions.unverified() == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_hf(_tiny("llama"))


def test_from_hf_under_an_unverified_release_warns_in_one_line(newer_transformers: str) -> None:
    with pytest.warns(versions.UnverifiedVersionWarning) as caught:
        from_hf(_tiny("falcon"))
    (w,) = caught
    text = str(w.message)
    assert newer_transformers in text and "\n" not in text and "memlab trace --hf" in text
    assert w.filename == __file__, "the warning points at the caller's line"


def test_a_local_build_tag_is_the_same_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions.importlib.metadata, "version", lambda name: versions.VERIFIED[name] + "+cu130")
    assert versions.installed("torch") == versions.VERIFIED["torch"]


def test_estimate_hf_under_an_unverified_release_answers_from_the_trace_with_the_formula_beside_it(
        newer_transformers: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(TINY / "llama.json")
    code = cli.main(["estimate", "--hf", path, "--seq", "16", "--batch", "1", "--precision", "bf16"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.count(newer_transformers) == 1 and "Warning" not in err, err
    assert "source of truth: trace" in out and "formula" in out and "<- peak" in out
    code = cli.main(["estimate", "--hf", path, "--seq", "16", "--batch", "1", "--precision", "bf16", "--json"])
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and d["source_of_truth"] == "trace" and newer_transformers in d["unverified_versions"]
    assert d["estimate"]["peak"] > 0 and d["peak_bytes"] > 0, "the trace's peak and the formula's, side by side"


def test_no_trace_keeps_the_formula_and_still_says_it_is_unverified(newer_transformers: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["estimate", "--hf", str(TINY / "llama.json"), "--seq", "16", "--no-trace", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err.count(newer_transformers) == 1
    d = json.loads(out)
    assert d["source_of_truth"] == "formula" and newer_transformers in d["unverified_versions"]


def test_a_published_preset_is_guarded_and_memlabs_own_gpt_is_not(newer_transformers: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A preset named after a published model is its Hugging Face config (guarded); ``ref:`` is memlab's own GPT,
    memlab's code, whose count no library release changes."""
    assert cli.main(["estimate", "--preset", "gpt2-small", "--seq", "64", "--no-trace"]) == 0
    assert capsys.readouterr().err.count(newer_transformers) == 1
    assert cli.main(["estimate", "--preset", "ref:gpt2-small", "--seq", "64"]) == 0
    assert "verified" not in capsys.readouterr().err
