"""A chapter's page: the executed notebook made fit for a reader, rendered offline, and written atomically.

What the page must not show: the build machine's paths (the report folder, the repository, the Python install, the
home and temporary directories are replaced by short placeholders), papermill's second copy of the parameters (the
``injected-parameters`` cell: its values are written into the one ``parameters`` cell instead, with ``out_dir``
relative), and a half-written file (every page and index is written to a temporary file in its folder and moved
into place with :func:`os.replace`, so a full disk leaves the previous file or none, never a truncated one).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memlab.course.chapter import REPO_ROOT

OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{% block extra_css %}<style>main{max-width:1100px;margin:0 auto}</style>{% endblock extra_css %}
"""
"""nbconvert's lab template without the scripts it loads from CDNs (require.js, MathJax, mermaid, widgets): the
chapters use plain markdown and PNG figures, which the page carries inline."""


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


def _shown_out_dir(out_dir: str, notebooks_dir: Path) -> str:
    """``out_dir`` as the reader's default cell writes it: relative to the notebooks folder when it lies inside
    the repository (``../reports/build/NN_topic``), else ``[report]/build/NN_topic``."""
    path = Path(out_dir)
    try:
        path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return f"[report]/{path.parent.name}/{path.name}"
    return os.path.relpath(path.resolve(), notebooks_dir.resolve())


def one_parameters_cell(nb: Any, params: Mapping[str, Any], notebooks_dir: Path) -> Any:
    """Drop papermill's ``injected-parameters`` cell and write the values used into the ``parameters`` cell.

    The page then shows one parameters cell with the values this run used (``out_dir`` without machine paths).
    """
    cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    shown = {**params, "out_dir": _shown_out_dir(str(params["out_dir"]), notebooks_dir)} if "out_dir" in params \
        else dict(params)
    for cell in cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = "\n".join(f"{k} = {v!r}" for k, v in shown.items())
            break
    nb.cells = cells
    count = 0
    for cell in cells:  # renumber In [n] so dropping the injected cell leaves no gap
        if cell.cell_type == "code" and cell.get("execution_count") is not None:
            count += 1
            cell.execution_count = count
            for output in cell.get("outputs", []):
                if "execution_count" in output:
                    output["execution_count"] = count
    return nb


def render_html(nb: Any, html_path: Path, title: str, paths: Mapping[str, str] | None = None) -> Path:
    """Write an executed notebook as a self-contained HTML page (images inline, no CDN scripts), atomically, with
    ``paths`` (:func:`machine_paths`) scrubbed from it."""
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", embed_images=True,
                            extra_loaders=[jinja2.DictLoader({"memlab_offline.html.j2": OFFLINE_TEMPLATE})])
    exporter.template_file = "memlab_offline.html.j2"
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    return write_atomic(html_path, scrub(body, paths if paths is not None else machine_paths()))
