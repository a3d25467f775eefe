"""The repository's plumbing: set-up commands, Makefile targets, CI script, the lock vs pyproject and conda's
environment."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _requirement(spec: str) -> tuple[str, str]:
    """('name', 'specifier') with the name normalised as PyPI does and the specifier's spaces removed."""
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$", spec)
    assert match, f"cannot read requirement {spec!r}"
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return name, match.group(3).replace(" ", "")


def _pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += [s for s in extra if not s.startswith("memlab")]
    return dict(_requirement(s) for s in specs)


def _environment_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    found: dict[str, str] = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for spec in dep.get("pip", []):
                if not spec.startswith("-"):
                    name, pin = _requirement(spec)
                    found[name] = pin
        else:
            name, pin = _requirement(dep.replace("=", "==", 1) if re.match(r"^[\w.-]+=[^=]", dep) else dep)
            if name not in {"python", "pip"}:
                found[name] = pin
    return found


LOCK = ROOT / "requirements.lock"


def _lock_entries() -> dict[str, tuple[str, int]]:
    """{name: (version, hashes)} of every requirement of requirements.lock (names normalised as PyPI does)."""
    entries: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if match:
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            entries[name] = (match.group(2), block.count("--hash=sha256:"))
    return entries


def _torch_pin() -> str:
    return re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1)


def test_the_lock_pins_every_dependency_of_every_extra_with_hashes_and_leaves_torch_to_its_pin() -> None:
    from packaging.specifiers import SpecifierSet

    locked = _lock_entries()
    assert len(locked) > 100, "the whole tree, not only the direct dependencies"
    assert not [n for n, (_, hashes) in locked.items() if hashes == 0], "every pin has its hashes"
    assert "torch" not in locked and not [n for n in locked if n.startswith(("triton", "cuda-"))
                                          or (n.startswith("nvidia-") and n != "nvidia-ml-py")], \
        "torch (and its CUDA wheels) come by the Makefile's TORCH pin"
    for name, spec in _pyproject_requirements().items():
        version = _torch_pin() if name == "torch" else locked[name][0]
        assert version in SpecifierSet(spec), f"pyproject's {name}{spec} excludes the locked {version}"


def test_pyproject_bounds_above_each_library_whose_code_the_exact_terms_count() -> None:
    from memlab.predict.spec.versions import VERIFIED

    ranges = _pyproject_requirements()
    assert set(VERIFIED) == {"torch", "transformers", "peft", "bitsandbytes", "accelerate", "deepspeed"}
    for name in VERIFIED:
        assert "<" in ranges[name], f"{name} has no upper bound in pyproject.toml"


def test_the_verified_versions_are_the_locked_ones() -> None:
    from memlab.predict.spec.versions import VERIFIED

    locked = {**{n: v for n, (v, _) in _lock_entries().items()}, "torch": _torch_pin()}
    assert {n: locked[n] for n in VERIFIED} == VERIFIED, "make lock records the lock's releases in VERIFIED"


def test_environment_yml_has_exactly_the_locks_pins_and_the_torch_pin() -> None:
    expected = {**{n: f"=={v}" for n, (v, _) in _lock_entries().items()}, "torch": f"=={_torch_pin()}"}
    found = _environment_requirements()
    assert set(found) == set(expected), (f"only in the lock: {sorted(set(expected) - set(found))}; "
                                         f"only in environment.yml: {sorted(set(found) - set(expected))}")
    differing = {n: (expected[n], found[n]) for n in expected if expected[n] != found[n]}
    assert not differing, f"pins differ (lock, environment.yml): {differing}"


def test_environment_yml_pins_the_python_that_pyproject_requires() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", requires).group(1).split("."))
    pinned = tuple(int(x) for x in python.split("=")[-1].split("."))
    assert pinned >= minimum


def test_readme_gives_exactly_two_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the Set-up section has one code block"
    commands = [line.strip() for line in blocks[0].splitlines() if line.strip()]
    assert commands == ["make report", "make test"]


def test_readme_maps_the_course_topics() -> None:
    readme = (ROOT / "README.md").read_text().lower()
    for topic in ("oom", "16 bytes per parameter", "amp", "checkpointing", "zero", "fsdp", "flashattention",
                  "roofline", "mfu", "nvidia-smi"):
        assert topic in readme, topic


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def test_makefile_has_the_targets() -> None:
    assert {"report", "test", "lab", "bench", "sync", "help", "clean", "chromium"} <= _make_targets()


def test_makefile_installs_the_lock_then_the_torch_pin_then_memlab() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH \?= torch==\d+\.\d+\.\d+$", makefile, flags=re.M)
    assert re.search(r"^VENV \?= \.venv$", makefile, flags=re.M)
    head, recipe = makefile.split("$(STAMP):", 1)[1].split("\n", 1)
    assert "requirements.lock" in head, "a new lock re-installs"
    recipe = recipe.split("\n\n", 1)[0]
    uv = recipe.index("$(PIP) --require-hashes --no-deps -r requirements-uv.lock")
    lock = recipe.index("uv pip install --quiet --python $(PY) --require-hashes --no-deps -r requirements.lock")
    assert re.search(r"^unexport PYTHONDONTWRITEBYTECODE$", makefile, flags=re.M), "bytecode is kept once compiled"
    assert uv < lock < recipe.index('"$(TORCH)"') < recipe.index("--no-deps --no-build-isolation -e ."), recipe
    assert "pip check" in recipe
    assert "upgrade-check" in _make_targets() and "lock" in _make_targets()


def test_the_uv_that_installs_the_lock_is_the_locks_own_pin() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_memlab_lock_script", ROOT / "scripts" / "lock.py")
    lock = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(lock)  # type: ignore[union-attr]
    assert (ROOT / "requirements-uv.lock").read_text() == lock.bootstrap(LOCK.read_text())


def test_make_help_lists_every_target_with_one_line() -> None:
    done = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True)
    for target in ("report", "test", "lab", "bench", "sync", "clean"):
        assert re.search(rf"^\s+make {target}\s+\S", done.stdout, flags=re.M), target


@pytest.mark.parametrize("is_root", ["0", ""])
def test_make_lab_passes_allow_root_only_as_root(is_root: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^IS_ROOT := \$\(filter 0,\$\(shell id -u\)\)$", makefile, flags=re.M)
    dry = subprocess.run(["make", "-n", "lab", f"IS_ROOT={is_root}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    lab_line = next(line for line in dry.splitlines() if "jupyter lab" in line)
    assert ("--allow-root" in lab_line) == bool(is_root)


def test_ci_run_is_an_executable_bash_script_that_runs_make_test() -> None:
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") or text.startswith("#!/bin/bash")
    assert "set -euo pipefail" in text
    assert re.search(r"^make test$", text, flags=re.M)
    assert "|| true" not in text and "exit 0" not in text, "pytest's failures (and exit 5) must not be masked"


def test_reports_folder_keeps_only_its_readme_in_git() -> None:
    ignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "reports/*" in ignore and "!reports/README.md" in ignore
    assert (ROOT / "reports" / "README.md").exists()
