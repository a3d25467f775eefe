"""``make upgrade-check``: would memlab stay exact under the newest releases? A drift table, before the lock moves.

1. Resolve the newest releases that pyproject's lower bounds admit, its upper bounds lifted (``scripts/lock.py``'s
   :func:`compile_lock` with ``newest=True``; torch stays at ``--torch``: a newer torch is a separate, larger
   download, ``make upgrade-check TORCH=torch==X``), and install them into a scratch venv
   (``.cache/upgrade-check/venv``) as ``make`` installs the lock.
2. Run there what other people's code decides: :mod:`memlab.studies.drift` (every family at every precision and
   attention against a real step, each family's trace, peft's LoRA, bitsandbytes' QLoRA), the test modules that
   check those byte for byte, and the chapter build at ci scale (its pages scanned for a printed warning).
3. Print the table, per library and family: exact, drifted (the largest difference, bytes and percent) or broken
   (the error); write ``.cache/upgrade-check/report.json``. Exit status 0 when everything is exact.

``make lock`` then lets the guarded releases (:data:`memlab.predict.spec.versions.VERIFIED`) move only to the releases
of a green report. ``--skip-install`` reuses the scratch venv; ``--skip-book`` and ``--skip-tests`` leave those out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lock import REPORT, ROOT, bootstrap, compile_lock, pins, verified

SCRATCH = REPORT.parent
TEST_MODULES = ("tests/run/test_hf.py", "tests/tracing/test_trace_hf.py", "tests/predict/memory/test_finetune.py",
                "tests/tracing/test_trace_peft.py", "tests/run/test_masks.py", "tests/predict/families/test_hf.py",
                "tests/predict/families/test_hf_families.py", "tests/predict/families/test_config_keys.py")
"""The suites whose truth is other people's code: transformers' modelling files, peft, bitsandbytes."""
WARNING_TEXT = re.compile(r"\.py:\d+: [A-Z]\w*Warning:|class=\"output stderr\"")


def scratch_env() -> dict[str, str]:
    """The environment of every command in the scratch venv: compiled bytecode kept (as make's recipes do), and the
    guard's own line filtered out (:data:`memlab.predict.spec.versions.GUARD_PREFIX`): under the releases being checked
    it is expected on every page that builds a Hugging Face model, and would hide any other warning's drift."""
    from memlab.predict.spec.versions import GUARD_PREFIX

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), f"ignore:{GUARD_PREFIX}") if w)
    return env


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, text=True, env=scratch_env(), **kw)


def install(venv: Path, lock: Path, torch_pin: str) -> None:
    """The scratch venv, installed as ``make`` installs .venv: uv (the lock's pin), the lock by uv, torch by its
    pin, memlab, pip check."""
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    uv_lock = lock.with_name("newest-uv.lock")
    uv_lock.write_text(bootstrap(lock.read_text()))
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--require-hashes", "--no-deps", "-r", str(uv_lock)], check=True)
    _run([str(venv / "bin" / "uv"), "pip", "install", "--quiet", "--python", py, "--require-hashes", "--no-deps",
          "-r", str(lock)], check=True)
    for step in (["--no-compile", torch_pin], ["--no-deps", "--no-build-isolation", "-e", "."]):
        _run([*pip, *step], check=True)
    _run([py, "-m", "pip", "check"], check=True)


def drift(py: Path) -> dict[str, Any]:
    """memlab.studies.drift in the scratch venv, its rows echoed as they finish."""
    out = SCRATCH / "drift.json"
    out.unlink(missing_ok=True)
    done = _run([str(py), "-m", "memlab.studies.drift", "--json", str(out)], stderr=subprocess.PIPE)
    if not out.exists():  # memlab itself did not run: one broken row with the last line it printed
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"rows": [{"library": "memlab", "family": "import", "case": "python -m memlab.studies.drift",
                          "verdict": "broken", "detail": last, "worst_bytes": None, "worst_percent": None,
                          "seconds": 0.0}]}
    return json.loads(out.read_text())


def tests(py: Path) -> list[dict[str, Any]]:
    """The byte-for-byte test modules in the scratch venv, one row per module: exact when every test passes."""
    rows = []
    for module in TEST_MODULES:
        start = time.perf_counter()
        done = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", module],
                    capture_output=True)
        tail = [line for line in done.stdout.splitlines() if line.strip()]
        failed = [line.split(" ", 1)[1].split(" - ")[0] for line in done.stdout.splitlines()
                  if line.startswith(("FAILED", "ERROR"))]
        verdict = "exact" if done.returncode == 0 else ("drifted" if failed else "broken")
        detail = (f"{len(failed)} failed: " + ", ".join(f.split("::", 1)[1] for f in failed[:4])) if failed else \
            ("" if done.returncode == 0 else (tail or ["?"])[-1])
        name = module.removeprefix("tests/").removesuffix(".py")  # run/test_hf and predict/families/test_hf are two
        rows.append({"library": "tests", "family": name, "case": (tail or [""])[-1][:60],
                     "verdict": verdict, "detail": detail, "worst_bytes": None, "worst_percent": None,
                     "seconds": round(time.perf_counter() - start, 1)})
    return rows


def book(py: Path) -> list[dict[str, Any]]:
    """The chapters at ci scale in the scratch venv: broken when one fails, drifted when a page prints a warning."""
    out = SCRATCH / "book"
    start = time.perf_counter()
    _run([str(py), "-m", "memlab.course.report", "--scale", "ci", "--force", "--no-progress", "--out", str(out)],
         capture_output=True)
    try:
        chapters = json.loads((out / "index.json").read_text())["chapters"]
    except (OSError, ValueError, KeyError):
        return [{"library": "book", "family": "all chapters", "case": "ci scale", "verdict": "broken",
                 "detail": "no index.json: the build did not finish", "worst_bytes": None, "worst_percent": None,
                 "seconds": round(time.perf_counter() - start, 1)}]
    rows = []
    for ch in chapters:
        if ch.get("status") == "planned":
            continue
        page = out / str(ch.get("html") or "")
        warned = bool(ch.get("html")) and page.is_file() and WARNING_TEXT.search(page.read_text()) is not None
        verdict = "broken" if ch["status"] == "failed" else ("drifted" if warned else "exact")
        err = ch.get("error") or {}
        detail = f"{err.get('ename')}: {err.get('evalue', '')[:120]}" if err else ("a warning on the page" if warned
                                                                                   else "")
        rows.append({"library": "book", "family": ch["name"], "case": "ci scale", "verdict": verdict,
                     "detail": detail, "worst_bytes": None, "worst_percent": None, "seconds": ch.get("run_time_s")})
    return rows


def summary(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(library, family, verdict, detail) per library and family: broken wins over drifted over exact; drifted
    names the largest difference; exact says how many checks."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["library"], r["family"])].append(r)
    out = []
    for (library, family), rs in groups.items():
        broken = [r for r in rs if r["verdict"] == "broken"]
        drifted = [r for r in rs if r["verdict"] == "drifted"]
        if broken:
            out.append((library, family, "broken", f"{len(broken)}/{len(rs)}: {broken[0]['case']}: "
                                                   f"{broken[0]['detail']}"))
        elif drifted:
            sized = [r for r in drifted if r.get("worst_bytes") is not None]
            worst = max(sized, key=lambda r: abs(r["worst_percent"] or 0.0)) if sized else drifted[0]
            size = (f"{worst['worst_bytes']:+,} B ({worst['worst_percent']:+.2f} %), " if sized else "")
            out.append((library, family, "drifted", f"{len(drifted)}/{len(rs)}, worst {size}{worst['case']}: "
                                                    f"{worst['detail']}"))
        else:
            out.append((library, family, "exact", f"{len(rs)} check(s)"))
    return out


def print_table(versions: dict[str, dict[str, str | None]], rows: list[dict[str, Any]]) -> bool:
    """The versions (verified vs newest) and the drift table; True when every row is exact."""
    print(f"\n{'release':<16}{'verified':<13}newest")
    for name, pair in versions.items():
        mark = "" if pair["verified"] == pair["newest"] else "  <- moves"
        print(f"  {name:<14}{pair['verified'] or '-':<13}{pair['newest'] or '-'}{mark}")
    print(f"\n{'library':<14}{'family':<30}{'verdict':<9}detail")
    table = summary(rows)
    for library, family, verdict, detail in table:
        print(f"{library:<14}{family:<30}{verdict:<9}{detail[:150]}")
    counts = {v: sum(t[2] == v for t in table) for v in ("exact", "drifted", "broken")}
    green = counts["drifted"] == 0 and counts["broken"] == 0
    print(f"\n{counts['exact']} exact, {counts['drifted']} drifted, {counts['broken']} broken: "
          + ("green: raise pyproject's upper bounds to admit these releases, then `make lock`" if green else
             "not green: the lock stays; each drift is work (a term to fix at its cause, or a version to exclude)"))
    return green


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make upgrade-check", description=__doc__.splitlines()[0])
    p.add_argument("--torch", default="torch==2.13.0", help="torch's pin in the scratch venv (the Makefile's TORCH)")
    p.add_argument("--find-links", type=Path, default=Path("/opt/wheels"), help="folder with torch's CPU wheel")
    p.add_argument("--skip-install", action="store_true", help="reuse the scratch venv as it is")
    p.add_argument("--skip-tests", action="store_true", help="leave out the byte-for-byte test modules")
    p.add_argument("--skip-book", action="store_true", help="leave out the chapter build")
    args = p.parse_args(argv)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    venv, lock = SCRATCH / "venv", SCRATCH / "newest.lock"
    if not args.skip_install:
        print("resolving the newest releases (pyproject's upper bounds lifted) ...", flush=True)
        compile_lock(lock, torch_pin=args.torch, find_links=args.find_links, newest=True)
        print(f"installing them into {venv.relative_to(ROOT)} ...", flush=True)
        install(venv, lock, args.torch)
    newest = {**pins(lock.read_text()), "torch": args.torch.split("==", 1)[1]}
    versions = {name: {"verified": v, "newest": newest.get(name)} for name, v in verified().items()}
    py = venv / "bin" / "python"
    started = time.perf_counter()
    rows = drift(py)["rows"]
    if not args.skip_tests:
        rows += tests(py)
    if not args.skip_book:
        rows += book(py)
    green = print_table(versions, rows)
    REPORT.write_text(json.dumps({"green": green and not (args.skip_tests or args.skip_book),
                                  "versions": {k: v["newest"] for k, v in versions.items()},
                                  "seconds": round(time.perf_counter() - started, 1), "rows": rows}, indent=1))
    print(f"report: {REPORT.relative_to(ROOT)}")
    return 0 if green else 1


if __name__ == "__main__":
    sys.exit(main())
