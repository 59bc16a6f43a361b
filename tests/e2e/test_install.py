"""An installed factory runs the shipped recipes from any folder (issue 23, point 1).

The wheel is built once from a copy of the checkout, installed *non-editable* into a fresh
venv, and the shipped recipes run from an empty folder: the recipes, templates, domain
packs, filters, seeds and mixtures come from the package data, not from the repository.
The fresh venv borrows this venv's dependencies through a ``.pth`` line instead of
installing them again (minutes, and PyPI); ``factory`` itself comes from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

_NOT_SHIPPED = shutil.ignore_patterns(
    ".git", ".venv", "venv", "out", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
    ".hypothesis", "tests",
)  # fmt: skip


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _fresh_venv(tmp: Path) -> Path:
    """A new venv with the wheel installed non-editable; its python."""
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SHIPPED)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp), "."], source)
    (wheel,) = tmp.glob("factory-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], tmp)
    python = tmp / "venv" / "bin" / "python"
    _run(
        [*pip, "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp
    )
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp
    )
    Path(purelib.strip(), "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_runs_the_shipped_recipes_from_an_empty_folder(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path)
    work = tmp_path / "empty"
    work.mkdir()
    # A Ray of its own: not the test session's (RAY_ADDRESS would join it, with the
    # workers of this venv), and no pytest marker (it re-raises instead of exiting).
    gone = ("PYTEST_CURRENT_TEST", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_TMPDIR=tempfile.mkdtemp(prefix="fi", dir="/tmp"),
        PYTHONPATH="",
    )
    where = _run([str(python), "-c", "import factory; print(factory.__file__)"], work, env)
    installed = Path(where.strip()).resolve()
    assert tmp_path / "venv" in installed.parents and ROOT not in installed.parents

    run = [str(python), "-m", "factory.run", "--no-progress"]
    _run([*run, "airline.yaml", "--devserver", "--set", "amplify.target=12", "-o", "a"], work, env)
    manifest = json.loads((work / "a" / "manifest.json").read_text())
    assert manifest["generated_with_devserver"] is True
    assert manifest["totals"]["accepted"] == 12

    small = ["--set", "envsim.episodes_per_round=30", "--set", "envsim.max_episodes=30"]
    _run([*run, "airline-envsim.yaml", *small, "-o", "e"], work, env)
    manifest = json.loads((work / "e" / "manifest.json").read_text())
    assert manifest["episodes"] == 30 and manifest["totals"]["accepted"] > 0
    # Everything the runs wrote is in the working folder, nothing beside the package.
    assert sorted(p.name for p in work.iterdir()) == ["a", "e"]
    assert not list((installed.parent / "packs").rglob("out"))
