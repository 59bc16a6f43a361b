"""Ray plumbing: how many one-row batches an async LLM stage really awaits at once.

Why this matters: Ray Data hands a batch on only when its slowest row is done, so the
LLM stages take one row per batch and need as many batches in flight per task as their
actor has request slots (issue 8: with Ray's default of 4 awaited batches, a heavy
latency tail left a third of the server's slots idle).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from factory.config import RayConfig
from factory.engine.stages.base import Stage

SLOTS = 24


class _Gate(Stage):
    """Each row waits until ``SLOTS`` rows of this actor are waiting together (or 2 s
    pass), then reports the most it saw at once. With fewer batches in flight than
    ``SLOTS`` the gate never opens and the peak stays below it."""

    name = "gate"
    requires = ()

    def __init__(self) -> None:
        self.waiting = 0
        self.peak = 0
        self.full = asyncio.Event()

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        if self.waiting >= SLOTS:
            self.full.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.full.wait(), timeout=2.0)
        self.waiting -= 1
        return {**row, "id": str(row["id"]), "message": str(self.peak)}


def _build_gate() -> _Gate:
    return _Gate()


def _peak(ray_session: Any, batches_per_task: int | None) -> int:
    import ray.data

    from factory.engine.pipeline import iter_rows
    from factory.engine.raycompat import map_stage

    ds = ray.data.range(2 * SLOTS, override_num_blocks=1)
    ds = map_stage(
        ds,
        _build_gate,
        ray_cfg=RayConfig(actors=1, num_cpus=0.25),
        is_async=True,
        batch_size=1,
        max_concurrent_batches=1,
        batches_per_task=batches_per_task,
    )
    return max(int(r["message"]) for r in iter_rows(ds))


def test_one_task_awaits_as_many_one_row_batches_as_asked(ray_session: Any) -> None:
    assert _peak(ray_session, SLOTS) >= SLOTS


def test_ray_still_names_the_constant_it_reads() -> None:
    """A Ray upgrade that renames the module constant must fail here, not quietly fall
    back to 4 batches per task."""
    from ray.data._internal.planner import plan_udf_map_op

    assert isinstance(plan_udf_map_op.DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY, int)


@pytest.mark.parametrize("n", [1, 8])
def test_the_setting_is_never_lowered(n: int) -> None:
    from ray.data._internal.planner import plan_udf_map_op

    from factory.engine.raycompat import await_batches_per_task

    before = plan_udf_map_op.DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY
    await_batches_per_task(n)
    assert max(before, n) == plan_udf_map_op.DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY


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
