"""What every file of the report needs: no path of the build machine, and no half-written file.

The build machine's paths (the report folder, the repository, the Python install, the home and temporary
directories) are replaced by short placeholders (:func:`machine_paths`, :func:`scrub`); every page, index and
cache is written to a temporary file in its folder and moved into place with :func:`os.replace`
(:func:`write_atomic`), so a full disk leaves the previous file or none, never a truncated one. The pages
themselves are built by :mod:`memlab.course.book`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from memlab.course.chapter import REPO_ROOT


def write_atomic(path: Path | str, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and :func:`os.replace`.

    Readers see the old file or the complete new one. When writing fails (a full disk: ``OSError``), the temporary
    file is removed, ``path`` is untouched and the error propagates.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def machine_paths(*extra: Path | str) -> dict[str, str]:
    """Absolute paths of this machine -> the placeholder a page shows instead, longest first.

    ``extra`` (the report folder, the notebooks folder) come first as ``[report]`` and ``[notebooks]``; then the
    repository (``[repo]``), Python's prefixes (``[python]``), the temporary directory (``[tmp]``) and home (``~``).
    """
    named = [(p, name) for p, name in zip(extra, ("[report]", "[notebooks]"), strict=False)]
    named += [(REPO_ROOT, "[repo]"), (sys.prefix, "[python]"), (sys.base_prefix, "[python]"),
              (sys.exec_prefix, "[python]"), (tempfile.gettempdir(), "[tmp]"), (Path.home(), "~")]
    table: dict[str, str] = {}
    for path, name in named:
        for variant in {str(path), str(Path(path).resolve())}:
            if len(variant) > 1 and variant not in table:
                table[variant] = name
    return dict(sorted(table.items(), key=lambda item: -len(item[0])))


def scrub(text: str, paths: Mapping[str, str]) -> str:
    """``text`` with every path of :func:`machine_paths` replaced by its placeholder."""
    for path, name in paths.items():
        text = text.replace(path, name)
    return text
