"""The code stays ruff-clean, formatted and type-checked (part of the test command)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "factory", "tests"],
        ["ruff", "format", "--check", "factory", "tests"],
        ["mypy", "factory"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_static_checks(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
