"""Sweeps that never lose a measurement: one JSON line per config, written the moment it is measured.

:func:`sweep` runs every (config, setup) point of a grid with :func:`memlab.run.runner.run_step`, appends each
result to a JSON-lines file (flushed and fsync'ed), and on a restart skips the points already in the file,
so an interrupted sweep resumes without repeating or losing rows. Out-of-memory results and failures are
recorded with their message and the sweep goes on. Progress is a tqdm bar on a terminal (or in a Jupyter kernel);
written to a file or pipe, it is one final line instead of a line per update (:func:`live_progress`). A damaged
line costs only itself:
it is skipped with a warning, set aside byte for byte in ``PATH.damaged`` and its point measured again; a lock on
``PATH.lock`` keeps two sweeps of one file from doubling rows; a FIFO or device is refused before it is opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memlab.device import canonical_device
from memlab.errors import MemlabError
from memlab.predict.memory.phases import PhaseRow
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

if TYPE_CHECKING:
    import pandas as pd

    from memlab.run.runner import Measurement


class DamagedRowsWarning(UserWarning):
    """A sweep file held lines that are not whole rows; they are skipped and their points measured again."""


def point_key(config: TransformerConfig, setup: Setup, device: str) -> str:
    """Stable id of a grid point: a hash of the config, the setup and the device's recorded name
    (:func:`memlab.device.canonical_device`: cpu == cpu:0, cuda == cuda:0)."""
    blob = json.dumps({"config": config.to_dict(), "setup": setup.to_dict(), "device": canonical_device(device)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_sweep_path(path: str | Path) -> Path:
    """``path`` as a Path if it can be a sweep file: a regular file, or a name that can be created. A folder, a FIFO
    (it would block the reader forever), a device such as ``/dev/full`` or ``/dev/null`` (rows would vanish), or a
    path under a file raise :class:`MemlabError` before anything is opened."""
    try:
        p = Path(path)
    except TypeError:
        raise MemlabError(f"a sweep file must be a path, got {path!r}") from None
    if not str(p).strip() or str(path) == "":
        raise MemlabError("a sweep file path is empty: give e.g. build/sweep.jsonl")
    try:
        st = p.stat()
    except FileNotFoundError:
        for parent in p.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise MemlabError(f"sweep file {str(p)!r}: {str(parent)!r} is a file, not a folder") from None
                break
        return p
    except OSError as exc:
        raise MemlabError(f"sweep file {str(p)!r} cannot be used: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise MemlabError(f"sweep file {str(p)!r} is a folder: give a file path inside it")
    if not stat.S_ISREG(st.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(st.st_mode) else "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
            st.st_mode) else "socket or special file"
        raise MemlabError(f"sweep file {str(p)!r} is a {kind}, not a regular file: rows must be kept in a file "
                          "(give e.g. build/sweep.jsonl)")
    return p


def _row_problem(row: object) -> str | None:
    """Why ``row`` (a parsed line) is not a whole sweep row, or None when it is."""
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    if not isinstance(row.get("key"), str) or not row["key"]:
        return "no key"
    try:
        _, m = measurement_of(row)
    except MemlabError as exc:
        return str(exc)
    if m.status not in ("ok", "oom", "error"):
        return f"unknown status {m.status!r}"
    if m.status == "ok" and m.params_bytes is None:
        return "measurement cut (status ok without its bytes)"
    return None


def _scan(data: bytes) -> tuple[dict[str, dict[str, Any]], list[str], list[bytes], list[bytes]]:
    """(good rows by key, the last good one per key; damage descriptions; whole lines kept; damaged lines)."""
    good: dict[str, dict[str, Any]] = {}
    damaged: list[str] = []
    kept: list[bytes] = []
    bad: list[bytes] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        problem = None
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problem = "invalid UTF-8"
        except ValueError:
            problem = "not JSON (torn or corrupted)"
        else:
            problem = _row_problem(row)
        if problem:
            damaged.append(f"line {number}: {problem}")
            bad.append(raw)
            continue
        kept.append(raw)
        good.pop(row["key"], None)  # a repeated key: the last good row wins, at its own place
        good[row["key"]] = row
    return good, damaged, kept, bad


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as exc:
        raise MemlabError(f"sweep file {str(p)!r} cannot be read: {exc.strerror or exc}") from None


def _damage_note(p: Path, damaged: list[str]) -> str:
    shown = "; ".join(damaged[:3]) + (f"; and {len(damaged) - 3} more" if len(damaged) > 3 else "")
    return f"sweep file {str(p)!r}: skipped {len(damaged)} damaged line(s) ({shown})"


def read_rows(path: str | Path, *, warn: bool = True) -> list[dict[str, Any]]:
    """The whole rows of a sweep file, one per key (the last good row of a key wins), in file order.

    A damaged line costs only itself: invalid UTF-8, text that is not JSON (a torn last line of a killed run), a
    JSON value that is not an object (``42``, ``null``, ``[]``), an object without ``key``, or a row whose
    measurement or config was cut are skipped with one :class:`DamagedRowsWarning` per read (``warn=False``
    silences it). :func:`sweep` moves them to ``PATH.damaged`` and measures their points again.
    """
    p = check_sweep_path(path)
    if not p.exists():
        return []
    good, damaged, _, _ = _scan(_read(p))
    if damaged and warn:
        warnings.warn(DamagedRowsWarning(_damage_note(p, damaged) + "; the next sweep measures their points again"),
                      stacklevel=2)
    return list(good.values())


def _quarantine(path: Path) -> list[dict[str, Any]]:
    """Under the sweep lock: the good rows of ``path``; damaged lines are moved (byte for byte) to
    ``PATH.damaged`` and the file is rewritten atomically without them, with one warning."""
    if not path.exists():
        return []
    good, damaged, kept, bad = _scan(_read(path))
    if not damaged:
        return list(good.values())
    aside = path.with_name(path.name + ".damaged")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with aside.open("ab") as fh:
            fh.write(b"".join(line + b"\n" for line in bad))
            fh.flush()
            os.fsync(fh.fileno())
        with tmp.open("wb") as fh:
            fh.write(b"".join(line + b"\n" for line in kept))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise MemlabError(f"cannot set the damaged lines of {str(path)!r} aside: {exc.strerror or exc}") from None
    warnings.warn(DamagedRowsWarning(_damage_note(path, damaged) + f", moved to {str(aside)!r}; their points are "
                                     "measured again now"), stacklevel=3)
    return list(good.values())


def _append(path: Path, row: dict[str, Any]) -> None:
    """Append one row as a line, flushed and fsync'ed; a torn last line (a kill mid-write) is closed first."""
    line = (json.dumps(row, default=str) + "\n").encode()
    try:
        with path.open("ab") as fh:
            if fh.tell() > 0:
                with path.open("rb") as tail:
                    tail.seek(-1, os.SEEK_END)
                    if tail.read(1) != b"\n":
                        line = b"\n" + line
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise MemlabError(f"cannot append to sweep file {str(path)!r}: {exc.strerror or exc}; the rows written "
                          "before are kept and a rerun resumes after them") from None


@contextlib.contextmanager
def sweep_lock(path: Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold an exclusive lock on ``PATH.lock`` (fcntl.flock) while one sweep writes ``path``, so two sweeps of one
    file cannot measure and append the same points twice. A second sweep waits up to ``wait_s`` seconds, then
    raises :class:`MemlabError` naming the holder's pid. The lock ends with the process, even on SIGKILL."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        yield
        return
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise MemlabError(f"cannot create the sweep lock {str(lock)!r}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + max(0.0, float(wait_s))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                    raise MemlabError(
                        f"another sweep is writing {str(path)!r} (pid {holder} holds {str(lock)!r}): wait for it "
                        "to finish (its points are then skipped here), pass lock_wait_s, or use another file"
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _measure(run: Callable[..., Measurement], config: TransformerConfig, setup: Setup, device: str,
             **kwargs: Any) -> dict[str, Any]:
    from memlab.run.runner import Measurement

    try:
        m = run(config, setup, device, **kwargs)
    except MemlabError as exc:
        m = Measurement(model=config.name, setup=setup.to_dict(), device=device, device_name="", status="error",
                        error=f"{type(exc).__name__}: {exc}")
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        m = Measurement(model=config.name, setup=setup.to_dict(), device=device, device_name="", status="error",
                        error=f"{type(exc).__name__}: {first}")
    return m.to_dict()


def _checked(grid: Iterable[tuple[TransformerConfig, Setup]]) -> list[tuple[TransformerConfig, Setup]]:
    points = list(grid)
    for i, point in enumerate(points):
        if not (isinstance(point, tuple | list) and len(point) == 2 and isinstance(point[0], TransformerConfig)
                and isinstance(point[1], Setup)):
            raise MemlabError(f"grid point {i} must be a (TransformerConfig, Setup) pair, got {type(point).__name__}")
    return points


def sweep(
    grid: Iterable[tuple[TransformerConfig, Setup]],
    path: str | Path,
    *,
    device: str = "auto",
    progress: bool = True,
    run: Callable[..., Measurement] | None = None,
    lock_wait_s: float = 0.0,
    **run_kwargs: Any,
) -> pd.DataFrame:
    """Measure every grid point not yet in ``path`` and return all rows as a DataFrame.

    Each row holds the point's key, config, the measurement (``run_step``'s fields) and a timestamp.
    ``run`` defaults to :func:`memlab.run.runner.run_step`; ``run_kwargs`` go to it (e.g. ``steps=1``).
    ``path`` must be a regular file or a new name (a FIFO or device is refused before it is opened); damaged lines
    are moved to ``PATH.damaged`` with a warning and their points measured again (:func:`read_rows`). While it
    runs the sweep holds ``PATH.lock`` (:func:`sweep_lock`); a second sweep of the same file waits ``lock_wait_s``
    seconds, then refuses. ``progress``: a live bar where the stream redraws it (:func:`live_progress`), else one
    final line on stderr.
    """
    from tqdm.auto import tqdm

    from memlab.device import device_string
    from memlab.run.runner import run_step

    run = run or run_step
    dev = device_string(device)
    path = check_sweep_path(path)
    points = {point_key(c, s, dev): (c, s) for c, s in _checked(grid)}  # a point listed twice is measured once
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MemlabError(f"cannot create the folder of sweep file {str(path)!r}: {exc.strerror or exc}") from None
    with sweep_lock(path, lock_wait_s):
        done = {r["key"] for r in _quarantine(path)}  # under the lock: another sweep's rows count as done
        todo = [(key, c, s) for key, (c, s) in points.items() if key not in done]
        live = progress and live_progress(sys.stderr)
        bar = tqdm(total=len(points), initial=len(points) - len(todo), disable=not live, desc="sweep",
                   unit="cfg", mininterval=1.0, file=sys.stderr)
        start, measured = time.perf_counter(), 0
        try:
            for key, config, setup in todo:
                bar.set_postfix_str(f"{config.name} {setup.precision} {setup.attention} {setup.recompute}")
                row = {"key": key, "config": config.to_dict(), "time": time.time(),
                       "measurement": _measure(run, config, setup, dev, **run_kwargs)}
                _append(path, row)
                measured += 1
                bar.update(1)
        finally:
            bar.close()
            if progress and not live:  # a file or a pipe: one line, not one per update
                done = len(points) - len(todo) + measured
                print(f"sweep: {done}/{len(points)} cfg ({measured} measured, {len(points) - len(todo)} already in "
                      f"{path.name}) in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        return to_frame(read_rows(path, warn=False))


def live_progress(stream: Any) -> bool:
    """Whether a progress bar on ``stream`` is redrawn in place: a terminal, or a Jupyter kernel's output (tqdm.auto's
    widget, or its text bar). A file or a pipe (``make bench > log``, CI) is not: each update would be a new line."""
    isatty = getattr(stream, "isatty", None)
    try:
        if callable(isatty) and isatty():
            return True
    except (OSError, ValueError):  # a closed or detached stream
        return False
    return "ipykernel" in sys.modules


def measurement_of(row: dict[str, Any]) -> tuple[TransformerConfig, Measurement]:
    """The (config, Measurement) a sweep row holds; a row that cannot give them raises :class:`MemlabError`."""
    from memlab.run.runner import Measurement

    if not isinstance(row, dict):
        raise MemlabError(f"a sweep row must be a dict, got {type(row).__name__}")
    if not isinstance(row.get("config"), dict) or not isinstance(row.get("measurement"), dict):
        raise MemlabError("config or measurement missing or cut")
    m = dict(row["measurement"])
    try:
        m["phases"] = tuple(m.get("phases") or ())
        m["phase_peaks"] = tuple(PhaseRow.from_dict(r) for r in m.get("phase_peaks") or ())
        m["timeline"] = tuple(m.get("timeline") or ())
        config = TransformerConfig(**row["config"])
        measurement = Measurement(**m)
    except TypeError as exc:  # missing or unknown fields: the row was cut or written by something else
        raise MemlabError(f"config or measurement incomplete ({exc})") from None
    if not isinstance(measurement.setup, dict) or not isinstance(measurement.status, str):
        raise MemlabError("measurement cut (no setup or status)")
    Setup(**measurement.setup)  # a setup that no longer validates is a damaged row (SetupError names the field)
    return config, measurement


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One flat DataFrame row per sweep row (setup fields, measured scalars, ``key``)."""
    import pandas as pd

    out = []
    for row in rows:
        _, m = measurement_of(row)
        out.append({"key": row["key"], **m.to_row()})
    return pd.DataFrame(out)
