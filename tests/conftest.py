"""Shared fixtures: repository paths, the reference data folder, one Ray session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TAUBENCH = SHARED / "data" / "taubench-airline"

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def taubench_dir() -> Path:
    """The tau-bench airline reference folder; tests using it skip only when it is absent."""
    if not TAUBENCH.is_dir():
        pytest.skip(f"reference data not found at {TAUBENCH} (../shared is absent)")
    return TAUBENCH
