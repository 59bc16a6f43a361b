"""Ray's session kept in one place: which cluster to join, a local start that survives
a slow machine, a shutdown that waits for Ray's processes.

Everything else that knows about Ray is the worker pool (``factory.engine.pool``);
stages stay plain Python.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from typing import Any

import ray

from factory.engine import interrupts

__all__ = ["init_ray", "ray_address", "shutdown_ray", "start_local_ray"]


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
    # Ray objects in cyclic garbage (an actor handle, an ObjectRef) must be freed while
    # Ray is up: freed later by a collection in any thread, the C++ core aborts the
    # process ("The core worker has already been shutdown", exit 1; seen when the report
    # was written beside the shutdown, 2026-11-26).
    gc.collect()
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
