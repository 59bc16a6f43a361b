"""Ray plumbing kept in one place: session start, Data context, stage operators.

Everything that knows about Ray lives here and in ``pipeline.py``; stages stay
plain Python. Resource settings come from the recipe's ``ray`` section and
are applied only in ``map_stage`` (fractional CPUs: an actor with a whole CPU
on a 2-core machine starves the read tasks and deadlocks the pipeline).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

import ray
import ray.data

from factory.config import RayConfig
from factory.engine import interrupts
from factory.engine.stages.base import AsyncStageUDF, Stage, StageSpec, StageUDF

__all__ = [
    "await_batches_per_task",
    "init_ray",
    "map_stage",
    "ray_address",
    "shutdown_ray",
    "start_local_ray",
]


def ray_address(configured: str | None = None) -> str:
    """The ``address`` for ``ray.init``: ``RAY_ADDRESS`` (as under ``ray job submit``),
    else the recipe's ``ray.address``, else ``"local"``.

    Never None: a bare ``ray.init()`` joins whatever cluster
    ``$RAY_TMPDIR/ray/ray_current_cluster`` names, so a stale file left by a dead
    head hangs the run on GCS retries and a live one is joined silently.
    """
    return os.environ.get("RAY_ADDRESS") or configured or "local"


def init_ray(address: str | None = None) -> None:
    """Join the cluster ``ray_address(address)`` names, else start a private local one.
    Secrets are never put into the runtime environment or job metadata: workers
    inherit the driver's environment variables on a local cluster, and on a remote
    cluster the recipe names variables that the cluster must provide."""
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        target = ray_address(address)
        with interrupts.keep_handlers():  # a local head installs its own SIGTERM handler
            if target == "local":
                start_local_ray()
            else:
                ray.init(address=target, log_to_driver=True)
    # Applied on every call, also when the caller started Ray itself (tests, notebooks):
    # determinism must not depend on who called ray.init().
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the driver shows one factory-level bar instead
    ctx.print_on_execution_start = False
    ctx.execution_options.preserve_order = True  # deterministic outputs for a fixed seed


def start_local_ray(attempts: int = 3, **init_kwargs: Any) -> None:
    """Start a private local Ray, again if its start-up timed out: Ray gives its raylet a
    fixed 30 s to register with the GCS, which a busy 2-core machine can exceed."""
    import psutil

    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, **init_kwargs}
    for attempt in range(1, attempts + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        # A start that times out drops its node and with it the ``Popen`` handles of
        # the GCS, raylet ... while they still run: each warns "subprocess N is still
        # running" as it is collected (pytest made that 10 errors in a test's set-up on
        # a loaded machine, 2026-11-22). Those processes are ended and reaped just below
        # (``_discard_failed_start``), so the warning says nothing here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "subprocess .* is still running", ResourceWarning)
            try:
                ray.init(address="local", **kwargs)
                return
            except Exception as exc:
                if attempt == attempts or "timed out during startup" not in str(exc):
                    raise
                del exc
            _discard_failed_start(before)


def shutdown_ray(timeout_s: float = 30.0) -> None:
    """Shut down the Ray this process started and wait until its processes have exited.

    Why: ``ray.shutdown()`` signals its GCS, raylet, log monitor ... but on a busy machine
    returns before they are gone, and drops their ``Popen`` handles; a handle collected
    while its process runs warns "subprocess N is still running" (pytest turns that into
    a test failure: a fresh-clone CI run, 2026-11-22), and a Ray started next races the
    old one for the machine. The handles are taken before the shutdown and reaped after.
    """
    node = getattr(ray._private.worker, "_global_node", None)
    handles = [
        info.process
        for infos in (node.all_processes.values() if node is not None else ())
        for info in infos
        if getattr(info, "process", None) is not None
    ]
    ray.shutdown()
    _reap(handles, timeout_s)


def _reap(handles: list[Any], timeout_s: float) -> None:
    """Wait for each ``Popen`` in ``handles`` (kill the ones still running after
    ``timeout_s`` in all), so none is collected while its process runs."""
    import subprocess
    import time

    deadline = time.monotonic() + timeout_s
    for proc in handles:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)


def _discard_failed_start(before: set[int]) -> None:
    """End the processes a failed ``ray.init`` left running (a GCS, a raylet ...) so the
    next attempt starts alone, and reap them through Ray's own ``Popen`` handles (found
    by pid: a failed start leaves no node object to ask)."""
    import gc
    import subprocess

    import psutil

    with contextlib.suppress(Exception):
        ray.shutdown()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    pids = {p.pid for p in left}
    _reap([o for o in gc.get_objects() if isinstance(o, subprocess.Popen) and o.pid in pids], 10)
    psutil.wait_procs(left, timeout=10)


def await_batches_per_task(n: int) -> None:
    """Let Ray Data await at least ``n`` batches of one task of an async UDF at once.

    Why: Ray 2.60 awaits at most ``RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY``
    (default 4) batches per task and hands a batch on only when its slowest row is
    done; an LLM stage of small batches needs enough of them in flight to fill its
    actor's request slots, or a heavy latency tail leaves the slots idle (issue 8: 43 of
    64 requests open at the server with 4 batches of 40 rows per task). Ray reads the
    value from a module constant when it plans the dataset on the driver (the closure
    it builds goes to the actors), so it is raised there, process-wide and never
    lowered (a user's larger environment value stands). A Ray upgrade that renames the
    constant fails ``tests/engine/test_raycompat.py`` instead of silently losing throughput.
    """
    from ray.data._internal.planner import plan_udf_map_op

    name = "DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY"
    current = getattr(plan_udf_map_op, name)
    if n > current:
        setattr(plan_udf_map_op, name, n)


def map_stage(
    ds: ray.data.Dataset,
    build: Callable[..., Stage],
    *args: Any,
    ray_cfg: RayConfig,
    is_async: bool = False,
    then: list[StageSpec] | None = None,
    batch_size: int | None = None,
    max_concurrent_batches: int | None = None,
    batches_per_task: int | None = None,
) -> ray.data.Dataset:
    """Append one stage (and the stages in ``then``, run in the same actor) as an
    actor-pool operator. ``build(*args)`` runs inside each actor.

    ``max_concurrent_batches`` is the tasks (blocks) an async actor works on at once;
    ``batches_per_task`` the batches Ray Data awaits together within one task."""
    udf = AsyncStageUDF if is_async else StageUDF
    size = ray_cfg.actors
    # LLM stages keep a fixed pool (their concurrency budget is split across it); CPU
    # stages may stay at one actor for small inputs (a seed file is one block).
    strategy_kw: dict[str, Any] = {"size": size} if is_async else {"min_size": 1, "max_size": size}
    if max_concurrent_batches:
        # Async stages: several tasks of one actor await their requests together.
        strategy_kw["max_tasks_in_flight_per_actor"] = max_concurrent_batches
        strategy_kw["max_concurrent_calls_per_actor"] = max_concurrent_batches
    if batches_per_task:
        await_batches_per_task(batches_per_task)
    return ds.map_batches(
        udf,
        fn_constructor_args=([(build, args), *(then or [])],),
        batch_format="pyarrow",
        batch_size=batch_size or ray_cfg.batch_size,
        compute=ray.data.ActorPoolStrategy(**strategy_kw),
        num_cpus=ray_cfg.num_cpus,
    )
