"""memlab.run.sweep: one JSON line per measured point; a killed sweep resumes without losing or repeating rows; torn
lines are ignored; failures and OOMs are recorded and the sweep goes on."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memlab.model.gpt import GPT
from memlab.predict.memory.phases import PhaseRow
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.sweep import DamagedRowsWarning, measurement_of, point_key, read_rows, sweep, to_frame

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "slow_sweep.py"
FAST = {"steps": 1, "with_counted_flops": False, "with_mfu": False, "progress": False}
TINY = preset("tiny-gpt")




def _script_grid():
    spec = importlib.util.spec_from_file_location("slow_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.grid()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_killed_sweep_resumes_without_losing_or_repeating_rows(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(_lines(out)) < 3:
            assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read()!r}"
            assert time.monotonic() < deadline, "the sweep wrote fewer than 3 rows in 60 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    grid = _script_grid()
    before = read_rows(out)
    assert 3 <= len(before) < len(grid)

    # A kill in the middle of a write leaves half a line: it must be ignored, and the next row start afresh.
    with out.open("a") as fh:
        fh.write(json.dumps(before[0])[:40])
    with pytest.warns(DamagedRowsWarning, match="line 4: not JSON"):
        assert read_rows(out) == before

    with pytest.warns(DamagedRowsWarning, match="moved to"):
        frame = sweep(grid, out, device="cpu", **FAST)
    rows = read_rows(out)
    keys = [r["key"] for r in rows]
    assert sorted(keys) == sorted(point_key(c, s, "cpu") for c, s in grid)  # every point exactly once
    assert rows[: len(before)] == before  # finished rows untouched (same "time", same measurement)
    assert all(r["measurement"]["status"] == "ok" for r in rows)
    assert len(_lines(out)) == len(grid)  # the torn fragment was set aside, byte for byte
    assert _lines(out.with_name("sweep.jsonl.damaged")) == [json.dumps(before[0])[:40]]
    assert len(frame) == len(grid) and frame["key"].is_unique

    again = sweep(grid, out, device="cpu", **FAST)  # a finished sweep measures nothing
    assert read_rows(out) == rows and len(again) == len(grid)


def test_resume_skips_done_points_and_measures_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    grid = [(TINY, Setup(batch=1, seq=8, precision=p)) for p in ("fp32", "bf16", "amp-bf16")]
    calls: list[str] = []

    def counting(config, setup, device, **kw):
        from memlab.run.runner import run_step

        calls.append(setup.precision)
        return run_step(config, setup, device, **kw)

    sweep(grid[:2], out, device="cpu", run=counting, **FAST)
    first = read_rows(out)
    sweep(grid, out, device="cpu", run=counting, **FAST)
    assert calls == ["fp32", "bf16", "amp-bf16"]
    assert read_rows(out)[:2] == first
    assert [r["measurement"]["setup"]["precision"] for r in read_rows(out)] == ["fp32", "bf16", "amp-bf16"]


def test_a_point_repeated_in_the_grid_is_measured_once(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    point = (TINY, Setup(batch=1, seq=8))
    frame = sweep([point, point, (TINY, Setup(batch=1, seq=8, optimizer="sgd")), point], out, device="cpu", **FAST)
    keys = [r["key"] for r in read_rows(out)]
    assert len(keys) == 2 == len(set(keys)) == len(frame)


def test_failures_and_ooms_are_recorded_and_the_sweep_goes_on(tmp_path: Path, monkeypatch) -> None:
    real_forward = GPT.forward
    oom = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
           "1.23 GiB is free.")

    def forward(self, idx, *args, **kwargs):
        if idx.shape[1] == 12:  # the one point that "runs out of memory"
            raise torch.OutOfMemoryError(oom)
        return real_forward(self, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)
    grid = [
        (TINY, Setup(batch=1, seq=8, attention="efficient")),  # not on CPU: SetupError inside run_step
        (TINY, Setup(batch=1, seq=12)),
        (TINY, Setup(batch=1, seq=8)),
    ]
    out = tmp_path / "s.jsonl"
    frame = sweep(grid, out, device="cpu", **FAST)
    status = dict(zip(frame["seq"].astype(str) + frame["attention"], frame["status"], strict=True))
    assert status == {"8efficient": "error", "12eager": "oom", "8eager": "ok"}
    rows = read_rows(out)
    err = rows[0]["measurement"]["error"]
    assert err.startswith("SetupError: attention 'efficient' does not run on cpu") and "flash" in err
    assert rows[1]["measurement"]["oom"]["tried_to_allocate_bytes"] == 2 * 2**30
    _, m = measurement_of(rows[2])
    assert m.status == "ok" and m.params_bytes == 4 * TINY.param_count()


def test_unexpected_exceptions_become_error_rows_with_their_first_line(tmp_path: Path) -> None:
    def broken(config, setup, device, **kw):
        raise RuntimeError("kernel failed\nlong torch traceback text")

    frame = sweep([(TINY, Setup(batch=1, seq=8))], tmp_path / "s.jsonl", device="cpu", run=broken, **FAST)
    assert list(frame["status"]) == ["error"] and list(frame["error"]) == ["RuntimeError: kernel failed"]


def test_rows_round_trip_to_measurements_and_frames(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "dir" / "s.jsonl"  # parent folders are created
    frame = sweep([(TINY, Setup(batch=2, seq=8))], out, device="cpu", **FAST)
    (row,) = read_rows(out)
    assert set(row) == {"key", "config", "time", "measurement"}
    cfg, m = measurement_of(row)
    assert cfg == TINY and m.setup["batch"] == 2 and isinstance(m.phases, tuple)
    assert len(m.phase_peaks) == 8 and all(isinstance(r, PhaseRow) for r in m.phase_peaks)
    assert m.phase_peak("backward", "first").peak_bytes > 0
    older = [{k: r[k] for k in ("step", "phase", "peak_bytes", "end_bytes", "source")}
             for r in row["measurement"]["phase_peaks"]]  # rows written before PhaseRow
    assert measurement_of({**row, "measurement": {**row["measurement"], "phase_peaks": older}})[1] == m
    assert to_frame([row]).equals(frame)
    assert frame.loc[0, "model"] == "tiny-gpt" and frame.loc[0, "activations_bytes"] == m.activations_bytes


def test_point_key_depends_on_config_setup_and_device() -> None:
    s = Setup(batch=1, seq=8)
    k = point_key(TINY, s, "cpu")
    assert k == point_key(preset("tiny-gpt"), Setup(batch=1, seq=8), "cpu") and len(k) == 16
    assert k != point_key(TINY.with_(dropout=0.1), s, "cpu")
    assert k != point_key(TINY, s.with_(seq=9), "cpu")
    assert k != point_key(TINY, s, "cuda:0")


def test_read_rows_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_rows(tmp_path / "nothing.jsonl") == []


# -- quiet progress: a bar on a terminal, one final line in a file or pipe ---------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_a_terminal_is_one_final_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)  # not a Jupyter kernel either
    out = tmp_path / "s.jsonl"
    sweep(GRID[:3], out, device="cpu", run=_fake_run([]), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and err.count("\n") == 1, err  # tqdm would redraw with \r, one "line" per update
    assert err.startswith("sweep: 3/3 cfg (3 measured, 0 already in s.jsonl) in ")
    sweep(GRID, out, device="cpu", run=_fake_run([]), progress=True)
    assert capsys.readouterr().err.startswith("sweep: 4/4 cfg (1 measured, 3 already in s.jsonl) in ")
    sweep(GRID, tmp_path / "t.jsonl", device="cpu", run=_fake_run([]), progress=False)
    assert capsys.readouterr().err == ""


def test_progress_off_a_terminal_in_a_subprocess_writes_one_line_to_a_file(tmp_path: Path) -> None:
    code = """
import sys, time
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.runner import Measurement
from memlab.run.sweep import sweep

def run(config, setup, device, **kw):
    time.sleep(0.15)  # slower than tqdm's mininterval (1 s) over the grid: a bar would redraw several times
    return Measurement(model=config.name, setup=setup.to_dict(), device=device, device_name="cpu", params_bytes=1,
                       grads_bytes=0, optimizer_bytes=0)

sweep([(preset("tiny-gpt"), Setup(batch=1, seq=s)) for s in range(8, 20)], sys.argv[1], device="cpu", run=run)
"""
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.jsonl")], check=True, stderr=err,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    text = log.read_text()
    assert len(text.splitlines()) == 1 and "\r" not in text and text.startswith("sweep: 12/12 cfg"), text


def test_progress_on_a_terminal_is_a_live_bar(tmp_path: Path, monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    sweep(GRID, tmp_path / "s.jsonl", device="cpu", run=_fake_run([]), progress=True)
    text = terminal.getvalue()
    assert "\r" in text and "4/4" in text and not text.startswith("sweep: 4/4 cfg (")


# -- issue 8, section 3: damage costs at most the damaged row ------------------------------------------------------
def _fake_run(calls: list[int]):
    def run(config, setup, device, **kw):
        from memlab.run.runner import Measurement

        calls.append(setup.seq)
        return Measurement(model=config.name, setup=setup.to_dict(), device=device, device_name="cpu",
                           params_bytes=4 * config.param_count(), grads_bytes=0, optimizer_bytes=0)

    return run


GRID = [(TINY, Setup(batch=1, seq=s)) for s in (8, 9, 10, 11)]
QUIET = {"progress": False}


def _good_file(tmp_path: Path) -> tuple[Path, list[str]]:
    out = tmp_path / "s.jsonl"
    sweep(GRID, out, device="cpu", run=_fake_run([]), **QUIET)
    return out, _lines(out)


def _cut_measurement(line: str) -> bytes:
    row = json.loads(line)
    row["measurement"] = {"model": row["measurement"]["model"]}  # the key survived, the measurement did not
    return json.dumps(row).encode()


DAMAGE = {
    "invalid-utf8": lambda line: line.encode()[:30] + b"\xff\xfe" + line.encode()[30:],
    "torn": lambda line: line.encode()[: len(line) // 2],
    "number": lambda line: b"42",
    "null": lambda line: b"null",
    "list": lambda line: b"[]",
    "string": lambda line: b'"row"',
    "object-without-key": lambda line: json.dumps({k: v for k, v in json.loads(line).items() if k != "key"}).encode(),
    "key-not-a-string": lambda line: json.dumps({**json.loads(line), "key": 7}).encode(),
    "cut-measurement": _cut_measurement,
    "no-config": lambda line: json.dumps({**json.loads(line), "config": None}).encode(),
    "bad-config": lambda line: json.dumps({**json.loads(line), "config": {"d_model": True}}).encode(),
    "bad-setup": lambda line: json.dumps({**json.loads(line), "measurement": {
        **json.loads(line)["measurement"], "setup": {"batch": "one"}}}).encode(),
    "ok-without-bytes": lambda line: json.dumps({**json.loads(line), "measurement": {
        **json.loads(line)["measurement"], "params_bytes": None}}).encode(),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_line_is_skipped_with_a_warning_and_its_point_measured_again(tmp_path: Path, damage: str) -> None:
    out, lines = _good_file(tmp_path)
    broken = DAMAGE[damage](lines[1])
    out.write_bytes(b"\n".join([lines[0].encode(), broken, *(x.encode() for x in lines[2:])]) + b"\n")
    with pytest.warns(DamagedRowsWarning, match="line 2"):
        rows = read_rows(out)
    assert [r["key"] for r in rows] == [json.loads(x)["key"] for x in (lines[0], *lines[2:])]

    calls: list[int] = []
    with pytest.warns(DamagedRowsWarning, match="moved to"):
        frame = sweep(GRID, out, device="cpu", run=_fake_run(calls), **QUIET)
    assert calls == [9]  # only the damaged point is measured again
    assert sorted(frame["seq"]) == [8, 9, 10, 11] and frame["key"].is_unique
    assert (tmp_path / "s.jsonl.damaged").read_bytes() == broken + b"\n"  # set aside byte for byte, not lost
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_rows(out)) == 4  # clean again: no warning on later reads


def test_duplicates_keep_the_last_good_row(tmp_path: Path) -> None:
    out, lines = _good_file(tmp_path)
    newer = json.loads(lines[0])
    newer["time"] = 1.0
    with out.open("a") as fh:
        fh.write(lines[1] + "\n" + json.dumps(newer) + "\n")
    rows = read_rows(out)
    assert len(rows) == 4 and len({r["key"] for r in rows}) == 4
    assert next(r for r in rows if r["key"] == newer["key"])["time"] == 1.0
    assert len(to_frame(rows)) == 4


@pytest.mark.parametrize(("a", "b"), [("cpu", "cpu:0"), ("cpu", " CPU "), ("cuda", "cuda:0")])
def test_device_names_are_normalised_in_keys(a: str, b: str) -> None:
    s = Setup(batch=1, seq=8)
    assert point_key(TINY, s, a) == point_key(TINY, s, b)


def test_cpu_and_cpu0_sweeps_share_rows(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    calls: list[int] = []
    sweep(GRID[:2], out, device="cpu:0", run=_fake_run(calls), **QUIET)
    sweep(GRID[:2], out, device="cpu", run=_fake_run(calls), **QUIET)
    assert calls == [8, 9] and len(_lines(out)) == 2


def test_a_second_sweep_of_the_same_file_refuses_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    from memlab.errors import MemlabError
    from memlab.run.sweep import sweep_lock

    out = tmp_path / "s.jsonl"
    with sweep_lock(out):
        with pytest.raises(MemlabError, match=f"another sweep is writing.*pid {os.getpid()}"):
            sweep(GRID, out, device="cpu", run=_fake_run([]), **QUIET)
        t0 = time.monotonic()
        with pytest.raises(MemlabError, match="another sweep"):
            sweep(GRID, out, device="cpu", run=_fake_run([]), lock_wait_s=0.3, **QUIET)
        assert time.monotonic() - t0 >= 0.3
    assert not out.exists() or read_rows(out) == []
    sweep(GRID, out, device="cpu", run=_fake_run([]), **QUIET)  # free again
    assert len(read_rows(out)) == 4


def test_two_concurrent_sweeps_write_each_point_once(tmp_path: Path) -> None:
    import threading

    out = tmp_path / "s.jsonl"
    calls: list[int] = []
    slow = _fake_run(calls)

    def run(*args, **kw):
        time.sleep(0.05)
        return slow(*args, **kw)

    errors: list[Exception] = []

    def go() -> None:
        try:
            sweep(GRID, out, device="cpu", run=run, lock_wait_s=30, **QUIET)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    keys = [json.loads(x)["key"] for x in _lines(out)]
    assert len(keys) == 4 == len(set(keys)) and sorted(calls) == [8, 9, 10, 11]


@pytest.mark.parametrize("kind", ["fifo", "dev-full", "dev-null", "folder", "under-a-file"])
def test_special_files_fail_fast_with_a_clear_error(tmp_path: Path, kind: str) -> None:
    from memlab.errors import MemlabError

    if kind == "fifo":
        path = tmp_path / "s.jsonl"
        os.mkfifo(path)
    elif kind == "folder":
        path = tmp_path
    elif kind == "under-a-file":
        (tmp_path / "f").write_text("x")
        path = tmp_path / "f" / "s.jsonl"
    else:
        path = Path("/dev/full" if kind == "dev-full" else "/dev/null")
        if not path.exists():
            pytest.skip(f"{path} is Linux-only")
    t0 = time.monotonic()
    for call in (lambda: read_rows(path), lambda: sweep(GRID, path, device="cpu", run=_fake_run([]), **QUIET)):
        with pytest.raises(MemlabError) as err:
            call()
        assert "\n" not in str(err.value)
    assert time.monotonic() - t0 < 5, "must not block on a FIFO"
    assert not Path(str(path) + ".lock").exists() or kind == "folder"


def test_a_full_disk_while_appending_is_a_memlab_error(tmp_path: Path, monkeypatch) -> None:
    import errno

    from memlab.errors import MemlabError
    from memlab.run import sweep as sweep_mod

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sweep_mod.os, "fsync", full)
    with pytest.raises(MemlabError, match=r"No space left on device.*kept"):
        sweep(GRID, tmp_path / "s.jsonl", device="cpu", run=_fake_run([]), **QUIET)


@pytest.mark.parametrize("steps", [0, True, 1.5, "2", 10**6])
def test_run_step_refuses_bad_step_counts(steps) -> None:
    from memlab.errors import MemlabError
    from memlab.run.runner import run_step

    with pytest.raises(MemlabError, match="steps"):
        run_step(TINY, Setup(batch=1, seq=8), "cpu", steps=steps)


@pytest.mark.parametrize("grid", [[TINY], [(TINY,)], [(Setup(), TINY)], [("tiny-gpt", Setup())], [None]])
def test_a_malformed_grid_is_a_memlab_error(tmp_path: Path, grid) -> None:
    from memlab.errors import MemlabError

    with pytest.raises(MemlabError, match="grid point 0"):
        sweep(grid, tmp_path / "s.jsonl", device="cpu", run=_fake_run([]), **QUIET)
