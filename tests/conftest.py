"""Shared fixtures: repository paths, the reference data folder, one Ray session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
