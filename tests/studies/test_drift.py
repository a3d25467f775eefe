"""The canary of ``make upgrade-check`` (issue 32, point 2): memlab.studies.drift's checks, its verdicts, and the
table scripts/upgrade_check.py prints from them; scripts/lock.py's bounds lifted for the newest releases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from memlab.studies import drift

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(f"_memlab_script_{name}", ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_every_family_at_every_precision_and_attention_and_the_libraries_are_checked() -> None:
    cases = [(lib, fam, case) for lib, fam, case, _ in drift.checks()]
    families = drift.families()
    assert len(families) == 20 and "falcon" in families
    for family in families:
        found = {case for lib, fam, case in cases if lib == "transformers" and fam == family}
        kinds = ("eager",) if family == "gemma2" else ("eager", "sdpa")  # transformers builds Gemma 2 eager only
        assert found == {f"{a} {p}" for a in kinds for p in ("fp32", "bf16", "amp-bf16")}, family
        assert ("trace", family) in {(lib, fam) for lib, fam, _ in cases}
    assert {lib for lib, _, _ in cases} == {"transformers", "trace", "peft", "bitsandbytes"}


def test_falcon_is_exact_under_the_locked_transformers() -> None:
    """transformers 5.25 rewrote Falcon's attention (repeat_kv, an fp32 softmax, no K/V index tensors): the rows
    that found the drift (activations +32 B, and -36,832 B in eager bf16) are exact again."""
    rows = drift.drift_rows(("falcon",))
    assert len(rows) == 7
    assert [(r.case, r.verdict, r.detail) for r in rows if r.verdict != "exact"] == []


def test_a_difference_is_drifted_with_its_size_and_an_error_is_broken() -> None:
    assert drift.judge({"activations": (10, 10)}) == ("exact", "", None, None)
    verdict, detail, worst, pct = drift.judge({"activations": (90, 100), "params": (7, 6)})
    assert verdict == "drifted" and worst == -10 and pct == pytest.approx(-10.0)
    assert "activations -10 B (-10.00 %)" in detail and "params +1 B" in detail

    def boom() -> dict[str, tuple[int, int]]:
        raise RuntimeError("a new kernel\nwith a traceback")

    row = drift._check("transformers", "llama", "eager fp32", boom)
    assert (row.verdict, row.detail) == ("broken", "RuntimeError: a new kernel")


def test_the_upgrade_table_names_the_worst_drift_per_family_and_is_green_only_when_all_is_exact(
        capsys: pytest.CaptureFixture[str]) -> None:
    up = _script("upgrade_check")
    rows = [drift.DriftRow("transformers", "falcon", "eager bf16", "drifted", "activations -36,832 B", -36832,
                           -10.42).to_dict(),
            drift.DriftRow("transformers", "falcon", "sdpa fp32", "drifted", "activations +32 B", 32, 0.01).to_dict(),
            drift.DriftRow("transformers", "llama", "eager fp32", "exact").to_dict(),
            drift.DriftRow("peft", "llama", "LoRA", "broken", "TypeError: x").to_dict()]
    versions = {"transformers": {"verified": "5.24.0", "newest": "5.25.0"}}
    assert up.print_table(versions, rows) is False
    out = capsys.readouterr().out
    assert "  transformers  5.24.0       5.25.0  <- moves" in out
    assert "falcon" + " " * 24 + "drifted  2/2, worst -36,832 B (-10.42 %), eager bf16" in out
    assert "llama" + " " * 25 + "exact    1 check(s)" in out and "broken   1/1: LoRA: TypeError: x" in out
    assert up.print_table(versions, rows[2:3]) is True


def test_the_newest_releases_are_resolved_with_pyprojects_upper_bounds_lifted() -> None:
    lock = _script("lock")
    lifted = lock.lifted_bounds()
    for name in ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "deepspeed"):
        (spec,) = [s for s in lifted if s.split(">")[0] == name]
        assert "<" not in spec and ">=" in spec, spec
    assert lock.pins("a-b==1.0 \\\n    --hash=sha256:00\nC_d==2.1 ; python_version >= '3'\n") == \
        {"a-b": "1.0", "c-d": "2.1"}
    assert lock.verified() == __import__("memlab.predict.spec.versions", fromlist=["VERIFIED"]).VERIFIED


def test_the_upgrade_check_filters_the_guards_own_line_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the releases it checks, every page that builds a Hugging Face model shows the guard's line; the scratch
    environment ignores exactly that line (by its start), so any other warning still marks a page drifted."""
    import subprocess

    from memlab.predict.spec import versions

    up = _script("upgrade_check")
    monkeypatch.setattr(versions, "installed", lambda name: "9.9.9")
    versions.unverified.cache_clear()
    try:
        line = versions.unverified_line()
    finally:
        versions.unverified.cache_clear()
    assert line is not None and line.startswith(versions.GUARD_PREFIX)
    code = ("import warnings; from memlab.predict.spec.versions import UnverifiedVersionWarning as U; "
            f"warnings.warn(U({line!r})); warnings.warn('another warning')")
    done = subprocess.run([sys.executable, "-c", code], env=up.scratch_env(), capture_output=True, text=True)
    assert "not verified" not in done.stderr and "another warning" in done.stderr, done.stderr
