"""``make lock``: write ``requirements.lock`` (every dependency of every extra, pinned with hashes) and
``environment.yml`` from ``pyproject.toml``, for Python 3.11 on Linux x86-64.

The lock is written by ``uv pip compile`` (the ``uv`` the lock itself installs into ``.venv``). torch is resolved
but not emitted: ``make`` installs it by its own pin (``TORCH``, the CPU wheel here, a CUDA build on a GPU machine),
after the lock, so torch's own dependencies come from the lock and a CUDA build adds only its exact-pinned CUDA
wheels. torch is resolved from the CPU wheel in ``--find-links`` (default ``/opt/wheels``) when that folder has it;
a lock that still names CUDA wheels is refused.

The lock moves only when it is green: when a library of :data:`memlab.predict.spec.versions.VERIFIED` would change
release, ``make lock`` refuses unless the last ``make upgrade-check`` (``.cache/upgrade-check/report.json``) was
green with exactly those releases; it then records them in ``VERIFIED``. ``--check`` only says whether the lock,
``environment.yml`` and ``VERIFIED`` agree with ``pyproject.toml``'s resolution (no file is written).

``upgrade_check.py`` uses :func:`compile_lock` with ``newest=True``: pyproject's upper bounds lifted (uv's
``--override``), so the newest releases are resolved.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
BOOTSTRAP = ROOT / "requirements-uv.lock"  # uv's own lines of the lock: pip installs uv, uv installs the lock
ENVIRONMENT = ROOT / "environment.yml"
VERSIONS = ROOT / "memlab" / "predict" / "spec" / "versions.py"
REPORT = ROOT / ".cache" / "upgrade-check" / "report.json"
PLATFORM = ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28")
CUDA_ONLY = re.compile(r"^(nvidia-(?!ml-py=)|triton==|cuda-)", re.M)  # torch's CUDA wheels, not NVML
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


def uv() -> str:
    """The uv next to this Python (the one ``.venv`` has from the lock), else ``uv`` on PATH."""
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else "uv"


def pins(lock_text: str) -> dict[str, str]:
    """``{name: version}`` of every ``name==version`` line of a lock (names lower-cased, ``_`` as ``-``)."""
    return {m.group(1).lower().replace("_", "-"): m.group(2) for m in PIN.finditer(lock_text)}


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Every requirement of ``[project]`` and of each extra, as written."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]


def lifted_bounds(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """uv overrides that drop pyproject's upper bounds (``transformers>=5.0,<5.26`` -> ``transformers>=5.0``)."""
    out = []
    for req in requirements(pyproject):
        if "<" not in req:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", req).group(0)  # type: ignore[union-attr]
        lower = [part for part in req[len(name):].split(",") if not part.strip().startswith("<")]
        out.append(name + ",".join(p.strip() for p in lower))
    return out


def torch_constraint(torch_pin: str, find_links: Path) -> str:
    """The constraint torch is resolved under: the local CPU wheel's version when ``find_links`` has it."""
    version = torch_pin.split("==", 1)[1]
    local = sorted(find_links.glob(f"torch-{version}+cpu-cp311-*.whl")) if find_links.is_dir() else []
    return f"torch=={version}+cpu" if local else f"torch=={version}"


def compile_lock(out: Path, *, torch_pin: str, find_links: Path, newest: bool = False) -> str:
    """Resolve pyproject (every extra) into ``out`` with hashes, torch not emitted; ``newest``: upper bounds lifted.
    Returns the lock's text; raises SystemExit with one line when uv fails or CUDA wheels slip in."""
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(torch_constraint(torch_pin, find_links) + "\n")
        cmd = [uv(), "pip", "compile", "pyproject.toml", "--all-extras", "--generate-hashes", *PLATFORM,
               "--no-emit-package", "torch", "--constraint", str(constraints), "--quiet",
               "--custom-compile-command", "make lock", "--output-file", str(out)]
        if find_links.is_dir():
            cmd += ["--find-links", str(find_links)]
        if newest:
            overrides = Path(tmp) / "overrides.txt"
            overrides.write_text("\n".join(lifted_bounds()) + "\n")
            cmd += ["--override", str(overrides), "--upgrade"]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"uv pip compile failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    text = out.read_text()
    if CUDA_ONLY.search(text):
        raise SystemExit(f"the lock names CUDA wheels: torch was resolved from PyPI's CUDA build; pass --find-links "
                         f"with the folder holding torch {torch_pin}'s CPU wheel")
    return text


def bootstrap(lock_text: str) -> str:
    """``requirements-uv.lock``: the lock's entry for uv (its pin and hashes), which ``make`` installs with pip
    first; uv then installs the whole lock (downloads in parallel: 13 s here against pip's two minutes)."""
    block = re.search(r"^uv==.*?(?=^\S|\Z)", lock_text, flags=re.M | re.S)
    if block is None:
        raise SystemExit("the lock has no uv: keep uv in pyproject's dev extra (make installs the lock with it)")
    lines = [line for line in block.group(0).splitlines() if not line.lstrip().startswith("#")]
    return "# written by `make lock` from requirements.lock: the pin of uv, which installs the lock\n" + \
        "\n".join(lines).rstrip(" \\") + "\n"


def environment_yml(locked: dict[str, str], torch_pin: str) -> str:
    """environment.yml for conda users: Python 3.11, torch by its pin, then every pin of the lock (no hashes)."""
    lines = ["# Conda environment for memlab, written by `make lock` from requirements.lock (do not edit it by hand;",
             "# the Makefile's .venv is the default route). The lock's pins without hashes; torch by its own pin",
             "# (CPU-only: the CPU wheel; a GPU box gets a CUDA build of it). tests/test_repo.py checks it.",
             "#   conda env create -f environment.yml && conda activate memlab",
             "name: memlab", "channels:", "  - conda-forge", "dependencies:", "  - python=3.11", "  - pip", "  - pip:",
             f"      - {torch_pin}"]
    lines += [f"      - {name}=={version}" for name, version in sorted(locked.items())]
    lines += ["      # memlab itself, editable", "      - -e ."]
    return "\n".join(lines) + "\n"


def verified() -> dict[str, str]:
    """:data:`memlab.predict.spec.versions.VERIFIED` as the source file has it (read, not imported)."""
    block = VERSIONS.read_text().split("VERIFIED: dict[str, str] = {", 1)[1].split("}", 1)[0]
    return dict(re.findall(r'"([\w-]+)": "([^"]+)"', block))


def write_verified(new: dict[str, str]) -> None:
    text = VERSIONS.read_text()
    head, rest = text.split("VERIFIED: dict[str, str] = {", 1)
    body = "".join(f'\n    "{k}": "{v}",' for k, v in new.items())
    VERSIONS.write_text(head + "VERIFIED: dict[str, str] = {" + body + "\n}" + rest.split("}", 1)[1])


def green_report() -> dict[str, str] | None:
    """The releases of the last ``make upgrade-check`` when it was green, else None."""
    try:
        report = json.loads(REPORT.read_text())
    except (OSError, ValueError):
        return None
    return report.get("versions") if report.get("green") else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make lock", description=__doc__.splitlines()[0])
    p.add_argument("--torch", default="torch==2.13.0", help="torch's pin (the Makefile's TORCH)")
    p.add_argument("--find-links", type=Path, default=Path("/opt/wheels"), help="folder with torch's CPU wheel")
    p.add_argument("--check", action="store_true", help="only check that the files agree with a fresh resolution")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text = compile_lock(Path(tmp) / "requirements.lock", torch_pin=args.torch, find_links=args.find_links)
    locked = pins(text)
    now = verified()
    want = {name: (args.torch.split("==", 1)[1] if name == "torch" else locked.get(name, "?")) for name in now}
    moved = {k: (now[k], want[k]) for k in now if now[k] != want[k]}
    if args.check:
        stale = [f for f, ok in ((LOCK, pins(LOCK.read_text()) == locked if LOCK.exists() else False),
                                 (BOOTSTRAP, BOOTSTRAP.exists() and BOOTSTRAP.read_text() == bootstrap(text)),
                                 (ENVIRONMENT, ENVIRONMENT.exists() and ENVIRONMENT.read_text()
                                  == environment_yml(locked, args.torch)),
                                 (VERSIONS, not moved)) if not ok]
        print("lock up to date" if not stale else "out of date: " + ", ".join(str(f.relative_to(ROOT))
                                                                              for f in stale))
        return 1 if stale else 0
    if moved:
        report = green_report()
        if report is None or any(report.get(k) != new for k, (_, new) in moved.items()):
            changes = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in moved.items())
            print(f"make lock: {changes} would enter the lock, and no green `make upgrade-check` has run with these "
                  "releases: run it first (the lock moves only when it is green)")
            return 1
        write_verified(want)
        print("memlab.predict.spec.versions.VERIFIED: " + ", ".join(f"{k} {v}" for k, v in want.items()))
    LOCK.write_text(text)
    BOOTSTRAP.write_text(bootstrap(text))
    ENVIRONMENT.write_text(environment_yml(locked, args.torch))
    print(f"wrote {LOCK.name} ({len(locked)} pins), {BOOTSTRAP.name} and {ENVIRONMENT.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
