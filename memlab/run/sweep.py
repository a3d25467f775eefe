"""Sweeps that never lose a measurement: one JSON line per config, written the moment it is measured.

:func:`sweep` runs every (config, setup) point of a grid with :func:`memlab.run.runner.run_step`, appends each
result to a JSON-lines file (flushed and fsync'ed), and on a restart skips the points already in the file,
so an interrupted sweep resumes without repeating or losing rows. Out-of-memory results and failures are
recorded with their message and the sweep goes on. Progress is shown with tqdm.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError
from memlab.predict.models import TransformerConfig
from memlab.predict.setup import Setup

if TYPE_CHECKING:
    import pandas as pd

    from memlab.run.runner import Measurement


def point_key(config: TransformerConfig, setup: Setup, device: str) -> str:
    """Stable id of a grid point: a hash of the config, the setup and the device."""
    blob = json.dumps({"config": config.to_dict(), "setup": setup.to_dict(), "device": device}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a sweep file; a torn last line (the process was killed mid-write) is ignored."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _append(path: Path, row: dict[str, Any]) -> None:
    # A kill can leave a torn last line; start on a fresh line so the next row is whole.
    needs_newline = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with path.open("a") as fh:
        if needs_newline:
            fh.write("\n")
        fh.write(json.dumps(row, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


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


def sweep(
    grid: Iterable[tuple[TransformerConfig, Setup]],
    path: str | Path,
    *,
    device: str = "auto",
    progress: bool = True,
    run: Callable[..., Measurement] | None = None,
    **run_kwargs: Any,
) -> pd.DataFrame:
    """Measure every grid point not yet in ``path`` and return all rows as a DataFrame.

    Each row holds the point's key, config, the measurement (``run_step``'s fields) and a timestamp.
    ``run`` defaults to :func:`memlab.run.runner.run_step`; ``run_kwargs`` go to it (e.g. ``steps=1``).
    """
    from tqdm.auto import tqdm

    from memlab.device import device_string
    from memlab.run.runner import run_step

    run = run or run_step
    dev = device_string(device)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    points = {point_key(c, s, dev): (c, s) for c, s in grid}  # a point listed twice is measured once
    done = {r["key"] for r in read_rows(path)}
    todo = [(key, c, s) for key, (c, s) in points.items() if key not in done]
    bar = tqdm(total=len(points), initial=len(points) - len(todo), disable=not progress, desc="sweep", unit="cfg",
               mininterval=1.0)
    try:
        for key, config, setup in todo:
            bar.set_postfix_str(f"{config.name} {setup.precision} {setup.attention} {setup.recompute}")
            row = {"key": key, "config": config.to_dict(), "time": time.time(),
                   "measurement": _measure(run, config, setup, dev, **run_kwargs)}
            _append(path, row)
            bar.update(1)
    finally:
        bar.close()
    return to_frame(read_rows(path))


def measurement_of(row: dict[str, Any]) -> tuple[TransformerConfig, Measurement]:
    """The (config, Measurement) a sweep row holds."""
    from memlab.run.runner import Measurement

    m = dict(row["measurement"])
    m["phases"] = tuple(m.get("phases") or ())
    return TransformerConfig(**row["config"]), Measurement(**m)


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One flat DataFrame row per sweep row (setup fields, measured scalars, ``key``)."""
    import pandas as pd

    out = []
    for row in rows:
        _, m = measurement_of(row)
        out.append({"key": row["key"], **m.to_row()})
    return pd.DataFrame(out)
