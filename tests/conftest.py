"""Shared fixtures: repository paths, the reference data folder, one Ray session, plug-in sites.

Also the suite's two speeds (docs/getting-started.md): a test is ``slow`` when it starts Ray, a
process or a whole run. Everything under ``tests/e2e/`` and every test that uses the
``ray_session`` fixture or the ``ray`` marker is marked here; a test that starts a process
marks itself. ``pytest -m "not slow"`` is the fast loop, and the guard below keeps it
honest: outside a ``slow`` test, starting Ray or a subprocess fails the test, naming it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TAUBENCH = SHARED / "data" / "taubench-airline"
TAUBENCH_RETAIL = SHARED / "data" / "taubench-retail"

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def site_on_path(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``root`` and put it first on ``sys.path`` (``monkeypatch`` takes it off again)."""
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return root


def install_distribution(site: Path, dist: str, group: str, points: Mapping[str, str]) -> None:
    """Lay out the ``dist-info`` of an installed distribution declaring ``points`` in ``group``.

    ``importlib.metadata`` reads it exactly as it reads what ``pip install`` leaves,
    so plug-in discovery is tested through the real metadata path.
    """
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n", encoding="utf-8"
    )
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}", encoding="utf-8")


SLOW_FIXTURES = frozenset({"ray_session"})
SLOW_MARKERS = ("ray", "slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests: whole runs (``tests/e2e/``), Ray sessions, the ``ray`` marker."""
    e2e = ROOT / "tests" / "e2e"
    for item in items:
        path = Path(str(item.fspath))
        if (
            e2e in path.parents
            or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
            or any(item.get_closest_marker(m) for m in SLOW_MARKERS)
        ):
            item.add_marker(pytest.mark.slow)


class SlowWork(AssertionError):
    """A test outside the ``slow`` mark started Ray or a process."""


@pytest.fixture(autouse=True)
def _fast_tests_stay_fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Outside ``slow`` tests, starting Ray or a subprocess is an error that says what to do:
    the fast loop (``-m "not slow"``) must stay seconds, not minutes."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    import subprocess

    name = request.node.nodeid

    def refuse(what: str):
        def raiser(*args: Any, **kwargs: Any) -> Any:
            raise SlowWork(f"{name} {what}: mark it @pytest.mark.slow (or test the pure function)")

        return raiser

    import multiprocessing.process
    import sys

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("starts a process"))

    if "ray" in sys.modules:
        monkeypatch.setattr(sys.modules["ray"], "init", refuse("starts Ray"))
    yield


@pytest.fixture(scope="session")
def taubench_dir() -> Path:
    """The tau-bench airline reference folder; tests using it skip only when it is absent."""
    if not TAUBENCH.is_dir():
        pytest.skip(f"reference data not found at {TAUBENCH} (../shared is absent)")
    return TAUBENCH


@pytest.fixture(scope="session")
def retail_dir() -> Path:
    """The tau-bench retail reference folder; tests using it skip only when it is absent."""
    if not TAUBENCH_RETAIL.is_dir():
        pytest.skip(f"reference data not found at {TAUBENCH_RETAIL} (../shared is absent)")
    return TAUBENCH_RETAIL


@pytest.fixture(scope="session")
def airline_world() -> dict[str, Any]:
    """One generated airline world for the session (seed 3: 40 users, 60 flights, 120
    reservations). Read-only: run calls on forks, ``AirlineEnv(airline_world).copy()``."""
    from factory.envs.airline.world import generate_world

    return generate_world(3, n_users=40, n_flights=60, n_reservations=120)


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory):
    """One local Ray for the whole session: 2 CPUs, no dashboard, a short temp dir
    (Ray's unix socket paths must stay under ~107 characters)."""
    import tempfile

    import ray

    short_tmp = tempfile.mkdtemp(prefix="ft", dir="/tmp")
    os.environ["RAY_TMPDIR"] = short_tmp
    from factory.engine.raycompat import init_ray, start_local_ray

    if not ray.is_initialized():
        start_local_ray(num_cpus=2, _temp_dir=short_tmp, log_to_driver=False)

    init_ray()  # applies the factory's DataContext settings to the running session
    yield ray
    from factory.engine.raycompat import shutdown_ray

    shutdown_ray()


@pytest.fixture()
def devserver():
    """Start a development LLM server on 127.0.0.1; ``devserver(**config)`` returns it."""
    from factory.devserver import DevServer, DevServerConfig

    servers = []

    def start(**kw):
        server = DevServer(DevServerConfig(**kw)).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()
