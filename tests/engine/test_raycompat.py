"""Ray's session: a local start that survives a slow machine, a shutdown that waits."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest


@pytest.mark.slow
def test_reap_waits_for_a_process_and_kills_it_past_the_deadline() -> None:
    import subprocess
    import sys

    from factory.engine.raycompat import _reap

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _reap([quick, stuck], timeout_s=0.5)
    assert quick.returncode == 0
    assert stuck.returncode is not None  # killed and reaped: no handle left running


SHUTDOWN_SCRIPT = """
import ray
from factory.engine.raycompat import shutdown_ray, start_local_ray
start_local_ray(num_cpus=1)
node = ray._private.worker._global_node
handles = [i.process for infos in node.all_processes.values() for i in infos if i.process]
shutdown_ray()
print(len(handles), sum(h.returncode is None for h in handles))
"""


@pytest.mark.slow
def test_shutdown_leaves_no_process_of_its_ray_running(tmp_path) -> None:
    """Every process Ray started for this driver has exited and been reaped when
    ``shutdown_ray`` returns (a handle dropped while its process runs warns, and pytest
    fails the test that happens to collect it)."""
    import os
    import subprocess
    import sys
    import tempfile

    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rs", dir="/tmp")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", SHUTDOWN_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    started, running = map(int, done.stdout.split()[-2:])
    assert started >= 3 and running == 0


@pytest.mark.slow
def test_a_timed_out_start_is_retried_and_its_dropped_processes_do_not_warn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ray start that times out drops the ``Popen`` handles of processes it started while
    they still run; on a loaded machine pytest turned their "subprocess N is still running"
    into errors in the next test's set-up. The retry must end those processes, reap them,
    and let no such warning out (no Ray is started here: ``ray.init`` is a stand-in)."""
    import subprocess
    import sys

    import psutil

    from factory.engine import raycompat

    started: list[int] = []
    unraisable: list[Any] = []
    calls = {"n": 0}

    def fake_init(**_: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            started.append(proc.pid)
            raise RuntimeError("The current node timed out during startup.")
        # the second attempt succeeds

    monkeypatch.setattr(raycompat.ray, "init", fake_init)
    monkeypatch.setattr(raycompat.ray, "shutdown", lambda: None)
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with warnings_as_errors():
        raycompat.start_local_ray(attempts=2)
    import gc

    gc.collect()
    assert calls["n"] == 2
    assert not psutil.pid_exists(started[0]) or psutil.Process(started[0]).status() == "zombie"
    assert unraisable == []


@contextlib.contextmanager
def warnings_as_errors() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
