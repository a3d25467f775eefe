"""The repository's plumbing: set-up commands, Makefile targets, CI script, conda environment vs pyproject."""

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


def test_environment_yml_lists_the_same_dependencies_and_pins_as_pyproject() -> None:
    in_pyproject, in_environment = _pyproject_requirements(), _environment_requirements()
    assert set(in_environment) == set(in_pyproject), (
        f"only in pyproject: {sorted(set(in_pyproject) - set(in_environment))}; "
        f"only in environment.yml: {sorted(set(in_environment) - set(in_pyproject))}"
    )
    differing = {n: (in_pyproject[n], in_environment[n]) for n in in_pyproject if in_pyproject[n] != in_environment[n]}
    assert not differing, f"pins differ (pyproject, environment.yml): {differing}"


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


def test_makefile_pins_torch_first_and_keeps_it_overridable() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH \?= torch==\d+\.\d+\.\d+$", makefile, flags=re.M)
    assert re.search(r"^VENV \?= \.venv$", makefile, flags=re.M)
    recipe = makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert recipe.index('"$(TORCH)"') < recipe.index('-e ".[course,dev]"'), "torch is installed before memlab"


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
