"""The code stays ruff-clean, formatted, type-checked and layered (part of the test command)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "factory", "tests"],
        ["ruff", "format", "--check", "factory", "tests"],
        ["mypy", "factory"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
@pytest.mark.slow
def test_static_checks(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_import_contracts() -> None:
    """Imports point down the layers and form no cycle (ARCHITECTURE.md; the contracts are
    ``[tool.importlinter]`` in pyproject.toml)."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
