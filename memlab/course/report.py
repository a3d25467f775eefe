"""``make report``: execute every chapter notebook in a fresh kernel, then build the course as a book.

``python -m memlab.course.report [--scale auto|ci|full] [--device auto|cpu|cuda] [--force] [--only NN] [--out reports]
[--notebooks notebooks] [--solutions] [--jobs N]``

Each ``notebooks/NN_topic.py`` (jupytext percent, the source of truth) is read into a notebook in memory and run
by papermill with ``scale``, ``device``, ``seed`` and ``out_dir = OUT/build/NN_topic`` injected, working directory
``notebooks/``; on a CPU as many chapters run at once as there are cores (:func:`default_jobs`, ``--jobs``), on a GPU
one at a time. The executed notebook becomes a page of the book (:mod:`memlab.course.book`: plumbing removed,
machine paths scrubbed, terms and citations linked) and, once every chapter ran, Sphinx builds the book into
``OUT`` (``OUT/index.html`` is its landing page; offline, nothing fetched). ``OUT/index.json`` lists the chapters
with status, run time, provenance and a summary of each chapter's ledger (``out_dir/ledger.csv``). A failing
chapter does not stop the others; the command exits 1 when any chapter (or the book build) failed. Chapters whose
notebook, ``memlab/`` source, recorded data, parameters and installed libraries (:func:`environment`) are unchanged
and whose page exists are skipped (``OUT/.cache.json``) unless ``--force``; :func:`seed_cache` lets another output
folder (the tests') reuse them. ``--solutions`` builds the instructor's book, every exercise's solution
shown open, into ``OUT/solutions/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memlab.course import book
from memlab.course.book import ledger_summary
from memlab.course.chapter import RECORDED_SHOWN, REPO_ROOT
from memlab.course.exercises import SOLUTIONS_ENV
from memlab.course.pages import machine_paths, scrub, write_atomic
from memlab.course.provenance import provenance
from memlab.device import SCALES, device_string, resolve_scale
from memlab.errors import MemlabError
from memlab.predict.spec.validate import canonical_choice

CACHE_VERSION = 1
NOTEBOOK_GLOB = "[0-9][0-9]_*.py"
SOURCE_HEAD_LINES = 4
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]
MAX_JOBS = 4
"""At most this many chapter kernels at once (each holds a few hundred MB and its own torch)."""
"""Passed to each chapter's kernel: its own log stays off the report's stderr: the start-up warning every ipykernel
prints ("Kernel is running over TCP without encryption") and the "KeyboardInterrupt caught in kernel" it logs when
shut down after a failing cell. A chapter's errors are its cells' outputs (the page and ``index.json``), and a kernel
that dies is reported by the client as that chapter's error."""

CHAPTERS: tuple[tuple[str, str, str], ...] = (
    ("00", "your_machine", "Your machine: its peaks, its bandwidth, and the units they are printed in"),
    ("01", "oom", "Anatomy of an OOM: the message, reserved vs allocated, fragmentation"),
    ("02", "bytes_per_param", "Sixteen bytes per parameter, and when it is 8, 18 or 20"),
    ("03", "mixed_precision", "Mixed precision (AMP): does bf16 halve memory?"),
    ("04", "activations_checkpointing", "Activations and checkpointing"),
    ("05", "zero_fsdp", "Data parallelism (DDP, ZeRO, FSDP): what each stage shards, per rank"),
    ("06", "model_parallel", "Model parallelism (TP, SP, PP, CP, EP): what each layout splits, and what it sends"),
    ("07", "flash_attention", "FlashAttention: the s² term that disappears"),
    ("08", "roofline_mfu", "Roofline and MFU: achieved FLOP/s against the right peak"),
    ("09", "nvidia_smi", "nvidia-smi misreadings: utilisation and memory used"),
    ("10", "inference", "Inference: weights, KV cache and MoE"),
    ("11", "your_model", "Your model: the whole budget"),
    ("12", "fine_tuning", "Fine-tune on your card: full, LoRA and QLoRA"),
)
"""The course plan: (number, slug, title) of every chapter. A chapter whose ``notebooks/NN_*.py`` exists is run
(its title then comes from the notebook); the others are listed in the index as planned."""


@dataclass(frozen=True)
class ChapterResult:
    """One chapter's line in the index. ``status``: ok | failed | cached | not run | planned; times in seconds.
    ``recorded``: the recorded GPU results the page shows (name -> label), empty when none."""

    id: str
    name: str
    title: str
    status: str
    run_time_s: float | None = None
    html: str | None = None
    figures: int = 0
    error: dict[str, Any] | None = None
    ledger: dict[str, Any] | None = None
    cache_key: str = ""
    recorded: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_notebooks(notebooks_dir: Path) -> list[Path]:
    """The chapter sources ``NN_*.py`` in ``notebooks_dir``, in chapter order."""
    return sorted(Path(notebooks_dir).glob(NOTEBOOK_GLOB))


def planned_chapters(present: list[str], notebooks_dir: Path) -> list[ChapterResult]:
    """The chapters of :data:`CHAPTERS` without a notebook among ``present`` (chapter numbers), as ``planned``
    lines; none for a notebooks folder other than the course's own (a test course has its own plan)."""
    if Path(notebooks_dir).resolve() != (REPO_ROOT / "notebooks").resolve():
        return []
    return [ChapterResult(id=number, name=f"{number}_{slug}", title=title, status="planned")
            for number, slug, title in CHAPTERS if number not in present]


def tree_hash(paths: list[Path], root: Path) -> str:
    """sha256 over the relative names and contents of ``paths`` (sorted), so any edit changes it."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def memlab_hash(root: Path = REPO_ROOT) -> str:
    """Hash of ``memlab/**/*.py`` and ``data/recorded/**`` (the code and recorded data chapters depend on)."""
    files = list((root / "memlab").rglob("*.py")) + [p for p in (root / "data" / "recorded").rglob("*") if p.is_file()]
    return tree_hash(files, root)


def environment() -> dict[str, str | None]:
    """What a chapter's numbers also depend on outside memlab: Python's version and the installed release of each
    library whose code memlab counts (:data:`memlab.predict.spec.versions.VERIFIED`: torch, transformers, peft, ...)."""
    from memlab.predict.spec.versions import VERIFIED, installed

    return {"python": sys.version.split()[0], **{name: installed(name) for name in VERIFIED}}


def cache_key(notebook: Path, code_hash: str, params: dict[str, Any]) -> str:
    """The chapter's cache key: its notebook source, the memlab hash, the injected parameters and the
    :func:`environment` (another torch or transformers release runs the chapter again)."""
    payload = {
        "version": CACHE_VERSION,
        "notebook": hashlib.sha256(Path(notebook).read_bytes()).hexdigest(),
        "memlab": code_hash,
        "params": {k: params[k] for k in sorted(params) if k != "out_dir"},
        "environment": environment(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def seed_cache(previous: Path, out: Path) -> list[str]:
    """Copy a previous report's chapter runs (``previous/.cache.json``, each chapter's ``build/NN_topic`` folder and
    page source) into a new, empty output folder ``out``, so that a run into ``out`` reuses those whose cache key
    still holds (same notebook, memlab source, parameters and environment) and executes the others. Returns the
    chapters copied (none when ``previous`` has no cache)."""
    cache = load_cache(Path(previous) / ".cache.json")
    copied = []
    for name, record in cache.items():
        build, page = Path(previous) / "build" / name, Path(previous) / book.SOURCE_DIR / f"{name}.ipynb"
        if record.get("status") not in ("ok", "cached") or not build.is_dir() or not page.is_file():
            continue
        shutil.copytree(build, out / "build" / name, dirs_exist_ok=True)
        (out / book.SOURCE_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copy2(page, out / book.SOURCE_DIR / page.name)
        copied.append(name)
    write_atomic(out / ".cache.json", json.dumps({"version": CACHE_VERSION,
                                                   "chapters": {n: cache[n] for n in copied}}, indent=1))
    return copied


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    """The chapter records of a previous run, or {} when there is none. A damaged cache (not JSON, not an object
    of this version, a record that is not a :class:`ChapterResult`) is treated as absent, with a one-line note on
    stdout: its chapters run again and the next run writes a sound one."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return _damaged(path, f"unreadable ({type(exc).__name__})")
    if not isinstance(data, dict):
        return _damaged(path, f"a JSON {type(data).__name__}, not an object")
    if data.get("version") != CACHE_VERSION:
        return {}  # an older memlab's cache: its keys cannot match, nothing is damaged
    chapters = data.get("chapters", {})
    names = {f.name for f in fields(ChapterResult)}
    if not isinstance(chapters, dict) or not all(isinstance(r, dict) and _REQUIRED <= set(r) <= names
                                                 for r in chapters.values()):
        return _damaged(path, "its chapter records are not memlab's")
    return chapters


_REQUIRED = {"id", "name", "title", "status"}
"""The fields a cached chapter record must hold to be rebuilt as a :class:`ChapterResult`."""


def _damaged(path: Path, why: str) -> dict[str, dict[str, Any]]:
    print(f"memlab report: note: the cache {path.name} is damaged ({why}); treated as absent, so every chapter runs",
          flush=True)
    return {}


def _title(nb: Any, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def count_figures(nb: Any) -> int:
    """How many PNG/SVG images the executed notebook's outputs hold."""
    return sum(
        1
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if {"image/png", "image/svg+xml", "image/jpeg"} & set(out.get("data", {}))
    )


@contextmanager
def _solutions_env(on: bool) -> Iterator[None]:
    old = os.environ.get(SOLUTIONS_ENV)
    os.environ[SOLUTIONS_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SOLUTIONS_ENV, None)
        else:
            os.environ[SOLUTIONS_ENV] = old


def _error_of(exc: BaseException, paths: dict[str, str] | None = None) -> dict[str, Any]:
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = getattr(exc, "evalue", None)
    if evalue is None:
        evalue = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    source = getattr(exc, "source", None) or ""
    paths = paths if paths is not None else machine_paths()
    return {"ename": ename, "evalue": scrub(str(evalue), paths), "cell_index": getattr(exc, "cell_index", None),
            "source_head": scrub("\n".join(source.splitlines()[:SOURCE_HEAD_LINES]), paths)}


def _recorded_shown(build: Path) -> dict[str, str]:
    try:
        shown = json.loads((build / RECORDED_SHOWN).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in shown.items()} if isinstance(shown, dict) else {}


def run_chapter(source: Path, out: Path, params: dict[str, Any], *, progress: bool, timeout_s: int,
                solutions: bool) -> ChapterResult:
    """Execute one chapter in a fresh kernel and write its page into the book's sources; failures are caught and
    described (the page of a failed chapter shows the failing cell's error)."""
    import jupytext
    import nbformat
    import papermill

    name = source.stem
    build = Path(params["out_dir"])
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    executed = build / f"{name}.ipynb"
    page_source = out / book.SOURCE_DIR / f"{name}.ipynb"
    page_source.unlink(missing_ok=True)  # a failed run must not leave the previous run's page behind
    title, error = name, None
    start = time.perf_counter()
    try:
        nb = jupytext.read(source)
        title = _title(nb, name)
        with _solutions_env(solutions):
            papermill.execute_notebook(nb, str(executed), parameters=params, cwd=str(source.parent),
                                       progress_bar=progress, request_save_on_cell_execute=False,
                                       execution_timeout=timeout_s, extra_arguments=KERNEL_ARGUMENTS)
    except Exception as exc:  # one failing chapter must not stop the others: record it and go on
        error = _error_of(exc)
    run_time_s = time.perf_counter() - start
    html, figures = None, 0
    paths = machine_paths(out, source.parent)
    if executed.exists():
        try:
            figures = count_figures(nbformat.read(executed, as_version=4))
            book.write_chapter_page(executed, out / book.SOURCE_DIR, paths)
            html = f"{name}.html"
        except Exception as exc:  # a page that cannot be written (a full disk) fails its chapter, not the report
            error = error or _error_of(exc, paths)
    if error:
        error = {**error, "evalue": scrub(error["evalue"], paths), "source_head": scrub(error["source_head"], paths)}
    return ChapterResult(id=name[:2], name=name, title=title, status="failed" if error else "ok",
                         run_time_s=round(run_time_s, 2), html=html, figures=figures, error=error,
                         ledger=ledger_summary(build / "ledger.csv"), recorded=_recorded_shown(build))


def _cached(record: dict[str, Any] | None, key: str, out: Path, build: Path) -> bool:
    return bool(record and record.get("cache_key") == key and record.get("status") in ("ok", "cached")
                and isinstance(record.get("html"), str) and build.exists()
                and (out / book.SOURCE_DIR / f"{record['name']}.ipynb").exists())


@dataclass(frozen=True)
class _Run:
    """A chapter to execute: its progress line's head, source, papermill parameters, cache key and the seconds its
    last run took (None when unknown: the longest known run starts first)."""

    head: str
    source: Path
    params: dict[str, Any]
    key: str
    last_s: float | None
    alone: bool = False


def _not_run(source: Path, out: Path, key: str) -> ChapterResult:
    """A chapter left out by ``--only``: its title, and its page from an earlier build where one exists."""
    import jupytext

    name = source.stem
    try:
        title = _title(jupytext.read(source), name)
    except Exception:  # an unreadable source fails when it is run; here it only lacks a title
        title = name
    kept = (out / book.SOURCE_DIR / f"{name}.ipynb").exists()
    return ChapterResult(id=name[:2], name=name, title=title, status="not run", cache_key=key,
                         html=f"{name}.html" if kept else None)


def runs_alone(source: Path) -> bool:
    """Whether the chapter times this machine (its peaks, a step's speed, CPU occupancy), so it runs with no other
    chapter beside it: its notebook's metadata ``memlab: {runs_alone: why}`` (the jupytext header)."""
    import jupytext

    try:
        meta = jupytext.read(source).metadata.get("memlab", {})
    except Exception:  # an unreadable source fails when it is run
        return False
    return bool(isinstance(meta, dict) and meta.get("runs_alone"))


def default_jobs() -> int:
    """Chapters executed at once: one per CPU core this process may use (each chapter is its own kernel process,
    mostly one busy thread: tracing on fake tensors is Python), at most :data:`MAX_JOBS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_JOBS))


def _run_one(run: _Run, out: Path, args: argparse.Namespace, jobs: int, where: str) -> ChapterResult:
    print(f"{run.head}: running {where} ...", flush=True)
    result = replace(run_chapter(run.source, out, run.params, progress=args.progress and jobs == 1,
                                 timeout_s=args.timeout, solutions=args.solutions), cache_key=run.key)
    line = f"{run.head}: {result.status} in {result.run_time_s} s"
    if result.error:
        line += f" -- {result.error['ename']}: {result.error['evalue']}"
    print(line, flush=True)
    return result


def run_chapters(runs: list[_Run], out: Path, args: argparse.Namespace, *, scale: str,
                 device: str) -> list[ChapterResult]:
    """Execute ``runs``, ``args.jobs`` chapters at a time (each in its own kernel; the longest last run first, so
    the slowest chapter does not start last); papermill's progress bars only when one runs at a time. Chapters that
    time the machine (:func:`runs_alone`) run first, one at a time. On a GPU (``device`` cuda) every chapter runs
    alone: two kernels on one card would share, and misreport, its memory."""
    jobs = 1 if device.startswith("cuda") else min(args.jobs or default_jobs(), max(1, len(runs)))
    where = f"at scale {scale} on {device}"
    order = sorted(runs, key=lambda r: -(r.last_s or 0.0))
    alone = [run for run in order if run.alone or jobs == 1]
    results = [_run_one(run, out, args, 1, where) for run in alone]  # first, while nothing else runs
    shared = [run for run in order if run not in alone]
    if shared:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait: each chapter runs in a kernel
            results += pool.map(lambda run: _run_one(run, out, args, jobs, where), shared)
    return results


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is a :class:`MemlabError` (one line from :func:`main`), not a usage dump."""

    def error(self, message: str) -> Any:
        raise MemlabError(f"{message} (see '{self.prog} --help')")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:  # '--scale CI' is ci, as everywhere
        if action.choices is not None:
            arg_string = canonical_choice(arg_string, action.choices)
        return super()._get_value(action, arg_string)


def _at_least_one(unit: str) -> Any:
    """An argparse type: a whole number of ``unit`` (plural form), at least 1."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of {unit}, got {text[:40]!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
        return value
    return parse


_positive_int = _at_least_one("seconds")


def _parse(argv: list[str] | None, prog: str = "python -m memlab.course.report") -> argparse.Namespace:
    parser = _Parser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=SCALES, default="auto", help="auto: ci on CPU, full on CUDA")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="re-run chapters even when their cache is valid")
    parser.add_argument("--only", action="append", default=[], metavar="NN",
                        help="run only chapter NN (repeat or comma-separate); others keep their last result")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports", help="report folder (default reports/)")
    parser.add_argument("--notebooks", type=Path, default=REPO_ROOT / "notebooks", help="chapter sources")
    parser.add_argument("--solutions", action="store_true",
                        help="the instructor's book, every solution shown open, into OUT/solutions/")
    parser.add_argument("--timeout", type=_positive_int, default=1800, help="seconds allowed per cell (default 1800)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide papermill's progress")
    parser.add_argument("--jobs", type=_at_least_one("chapters"), default=None, metavar="N",
                        help="chapters executed at once (default: one per CPU core, at most "
                             f"{MAX_JOBS}; one on a GPU)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[list[ChapterResult], dict[str, Any]]:
    """Run (or reuse) every chapter and write the index; returns the chapter results and the index data."""

    device = device_string(args.device)
    scale = resolve_scale(args.scale, device)
    out = (args.out / "solutions" if args.solutions else args.out).resolve()
    notebooks_dir = args.notebooks.resolve()
    sources = find_notebooks(notebooks_dir)
    if not sources:
        raise MemlabError(f"no chapter notebooks matching {NOTEBOOK_GLOB} in {notebooks_dir}; "
                          "pass --notebooks DIR with NN_topic.py files.")
    only = {part.strip() for item in args.only for part in item.split(",") if part.strip()}
    unknown = only - {s.name[:2] for s in sources}
    if unknown:
        raise MemlabError(f"--only {', '.join(sorted(unknown))}: no such chapter; have "
                          f"{', '.join(s.name[:2] for s in sources)}.")
    out.mkdir(parents=True, exist_ok=True)
    title = "memlab course report" + (" (solutions)" if args.solutions else "")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    building = {"title": title, "ok": False, "complete": False, "started": started, "scale": scale,
                "scale_requested": args.scale, "solutions": args.solutions, "provenance": {}, "chapters": []}
    write_atomic(out / "index.json", json.dumps(building, indent=1))  # until the run completes, the index says so
    write_atomic(out / "index.html", book.placeholder_index(started))  # (an interrupted run is never "ok")
    cache_path = out / ".cache.json"
    cache = load_cache(cache_path)
    code_hash = memlab_hash()
    runs: list[_Run] = []
    results: list[ChapterResult] = []
    for i, source in enumerate(sources, 1):
        name = source.stem
        build_dir = out / "build" / name
        params = {"scale": scale, "device": device, "seed": args.seed, "out_dir": str(build_dir)}
        key = cache_key(source, code_hash, {**params, "solutions": args.solutions})
        record = cache.get(name)
        head = f"[{i}/{len(sources)}] {name}"
        selected = not only or name[:2] in only
        if _cached(record, key, out, build_dir) and not (args.force and selected):
            result = replace(ChapterResult(**record), status="cached", ledger=ledger_summary(build_dir / "ledger.csv"))
            print(f"{head}: cached (ran in {result.run_time_s} s before; --force re-runs)", flush=True)
        elif not selected:
            result = _not_run(source, out, key)
            print(f"{head}: not run (not in --only)", flush=True)
        else:
            runs.append(_Run(head, source, params, key, (record or {}).get("run_time_s"), runs_alone(source)))
            continue
        results.append(result)
    with _solutions_env(args.solutions):
        results += run_chapters(runs, out, args, scale=scale, device=device)
    for result in results:
        if result.status != "not run":
            cache[result.name] = result.to_dict()
    results += planned_chapters([r.id for r in results], notebooks_dir)
    results.sort(key=lambda r: r.id)
    write_atomic(cache_path, json.dumps({"version": CACHE_VERSION, "chapters": cache}, indent=1))
    shown = {f"{r.id}: {name}": label for r in results for name, label in r.recorded.items()}
    index = {
        "title": title,
        "ok": not any(r.status == "failed" for r in results),
        "complete": True,
        "started": started,
        "scale": scale,
        "scale_requested": args.scale,
        "solutions": args.solutions,
        "provenance": {**provenance(device), "scale": scale, "seed": args.seed, "recorded_gpu_data": shown},
        "chapters": [r.to_dict() for r in results],
    }
    write_atomic(out / "index.json", json.dumps(index, indent=1))
    site = build_book(out, index, notebooks_dir, solutions=args.solutions)
    index = {**index, "ok": index["ok"] and site.status == 0,
             "book": {"status": site.status, "seconds": site.seconds, "warnings": len(site.warnings.splitlines())}}
    write_atomic(out / "index.json", json.dumps(index, indent=1))
    return results, index


def build_book(out: Path, index: dict[str, Any], notebooks_dir: Path, *, solutions: bool) -> book.SiteBuild:
    """The book over the chapters' pages (:mod:`memlab.course.book`): landing, course map, glossary, references,
    seed pages and the build page, then Sphinx into ``out``; one line on stdout says how long it took."""
    import jupytext

    chapters = []
    for ch in index["chapters"]:
        source = notebooks_dir / f"{ch['name']}.py"
        try:
            belief = book.belief(jupytext.read(source)) if source.exists() else ""
        except Exception:  # an unreadable chapter fails when it runs; in the map it only lacks its belief
            belief = ""
        chapters.append(book.BookChapter(id=ch["id"], name=ch["name"], title=ch["title"], status=ch["status"],
                                         belief=belief, page=ch["name"] if ch.get("html") else None))
    book.write_sources(out, index, chapters, solutions=solutions)
    site = book.build_site(out)
    warned = len(site.warnings.splitlines())
    note = f"; {warned} Sphinx warning line(s) in build/book-warnings.log" if warned else ""
    if site.status == 0:
        print(f"book: built in {site.seconds} s{note}", flush=True)
    else:
        print(f"report: the book build failed (Sphinx exit status {site.status}){note}", file=sys.stderr,
              flush=True)
    return site


def main(argv: list[str] | None = None, prog: str = "python -m memlab.course.report") -> int:
    """Build the report; 0 when every chapter ran (or was cached), 1 when one failed, 2 for bad input (one line
    ``memlab: error: ...`` on stderr, as the ``memlab`` command prints). ``prog`` names the command in messages."""
    try:
        args = _parse(argv, prog)
        results, index = build(args)
    except MemlabError as err:
        print(f"memlab: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk or an unwritable --out: the index written so far says "not complete"
        print(f"memlab report: cannot write the report in {args.out}: {err.strerror or err}; free space or pass "
              "--out DIR.", file=sys.stderr)
        return 1
    failed = [r.name for r in results if r.status == "failed"]
    if not index.get("ok") and not failed:  # every chapter ran but the book did not build (its line said why)
        return 1
    planned = sum(r.status == "planned" for r in results)
    where = (args.out / "solutions" if args.solutions else args.out).resolve() / "index.html"
    print(f"report: {where} ({len(results) - planned - len(failed)} of {len(results) - planned} chapters without "
          f"failure; {planned} planned)", flush=True)
    if failed:
        print(f"report: failed chapter(s): {', '.join(failed)}; their pages show the error", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
