"""The GPU session's plumbing, dry-run on a CPU (the brief: scripts/gpu_session.sh ready to run in a lent GPU's
minutes, the most valuable recordings first): the script's order, every script it calls present, the allocator
recording's ``--dry-run`` writing its JSON through the same per-step processes, and its refusal without a GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "scripts" / "gpu_session.sh"


def _calls() -> list[str]:
    return re.findall(r"^python3 (?:-m )?(\S+)", SESSION.read_text(), re.M)


def test_the_session_script_parses_records_the_allocator_first_and_calls_only_what_exists() -> None:
    assert subprocess.run(["bash", "-n", str(SESSION)], capture_output=True).returncode == 0
    calls = _calls()
    assert calls[:2] == ["scripts/record_allocator_snapshot.py", "scripts/record_max_batch.py"], calls
    for call in calls:
        assert call in ("pytest", "memlab.course.report") or (ROOT / call).is_file(), call


def test_the_allocator_recording_dry_runs_on_a_cpu(tmp_path: Path) -> None:
    script = str(ROOT / "scripts" / "record_allocator_snapshot.py")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, script, "--dry-run", "--out", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "allocator_replay.json").read_text())
    assert "dry run" in data["provenance"]["kind"] and len(data["rows"]) == 1
    for row in data["rows"]:
        assert "error" not in row, row
        m = row["model_of_the_trace"]
        assert m["reserved_peak_bytes"] >= m["allocated_peak_bytes"] >= m["requested_peak_bytes"] > 0



def test_the_allocator_recording_refuses_without_a_gpu_in_one_line(tmp_path: Path, capsys) -> None:
    assert _script("record_allocator_snapshot").main(["--out", str(tmp_path / "gpu")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "never recorded on a CPU" in err


def test_every_wheel_the_session_carries_is_pinned_in_the_lock() -> None:
    """scripts/fetch_device_wheels.sh fetches requirements.lock's pin of each name: a name the lock lacks would stop
    it before a session, not on the device."""
    text = (ROOT / "scripts" / "fetch_device_wheels.sh").read_text()
    names = re.search(r'NAMES="([^"]+)"', text).group(1).split()
    lock = (ROOT / "requirements.lock").read_text().lower()
    assert names and all(re.search(rf"^{re.escape(n)}==", lock, re.M) for n in names), names
    assert "carry" in text and ".whl" in (ROOT / ".gitignore").read_text()


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_max_batch_recording_dry_runs_on_a_cpu_and_refuses_without_a_gpu(tmp_path: Path, capsys) -> None:
    """memlab's side (the formula's two ends, the traced search in the cap) and the bisection's plumbing on a CPU;
    without --dry-run on a CPU, one line and exit 2."""
    record = _script("record_max_batch")
    assert record.main(["--dry-run", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "max_batch.json").read_text())
    assert "dry run" in data["provenance"]["kind"] and len(data["rows"]) == 1
    row = data["rows"][0]
    m = row["memlab"]
    assert m["formula_certain"] <= m["traced"] <= m["formula_up_to"] and row["measured"] is None
    assert row["plumbing"]["max_batch"] == 3  # the stand-in accepts batches up to 3
    capsys.readouterr()
    assert record.main(["--out", str(tmp_path / "gpu")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "never recorded on a CPU" in err
