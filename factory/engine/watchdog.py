"""A worker stops calling the moment its run's driver is gone.

Ray runs each worker in its own process group, so neither the OOM killer, a
``kill -9`` of the driver nor a kill of the driver's whole group reaches the
actors; Ray itself ends them only when it notices (measured: 0.3-5 s later),
and meanwhile they keep issuing LLM calls whose responses nobody will collect:
paid for twice on the resume.

The first signal is the driver's **lifeline** (``Lifeline``): a TCP socket the
driver listens on and every worker connects to. The kernel closes it the instant
the driver's process ends, however it ends, and ``check`` (called before every
request and every retry) reads it without blocking: a request is never started
after the driver is gone, even when the machine is so loaded that a polling
thread would not run for seconds (issue 22 measured 175-251 requests sent over
1.7-2.1 s after a ``kill -9`` with a 0.1 s poll). The watcher thread waits on
the same socket, so an idle worker learns it at once too. The slower signals
remain for what a socket cannot tell (a driver on a node that vanished): every
``POLL_S`` the thread checks

* the driver process (pid and create time, looked up in the GCS job table at
  start), when it runs on this node;
* the parent raylet (``os.getppid()`` changes when the raylet dies: a local
  Ray is fate-shared with the driver that started it);
* the job's state in the GCS (``is_dead``), every ``GCS_POLL_S``: the only
  signal on another node than the driver's.

On loss it sets a flag at once (``stopped``; ``check`` raises ``Interrupted``,
and LLM stages call it before each attempt, so no new request leaves), lets
responses already received be stored for ``GRACE_S``, then ends the process on
its event loop (never in the middle of a cache write) and, should that loop be
stuck, from the thread ``HARD_EXIT_S`` later. What a crash can re-pay is thus
exactly the requests in flight at the kill.

Two losses, told apart (``Loss.driver``; issue 33): the run's **driver** is gone
(the lifeline, the driver's pid, the job marked dead), or this worker's own
**node** is going (its raylet died; on a cluster the driver lives on). Both stop
calls the same way, but only the first is "the driver is gone": after the second
the driver issues the worker's items again on the other workers, so the worker
must give it nothing (``WorkerActor.collect`` never answers once stopped: an
item cut short here must not come back as a failed row). A worker whose run
ended normally is ``retire``d first: the lifeline closing then is no loss, and
nothing is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass

from factory.errors import EXIT_INTERRUPTED, Interrupted

__all__ = [
    "DriverWatch",
    "Lifeline",
    "Loss",
    "check",
    "loss_reason",
    "retire",
    "sleep",
    "start",
    "stopped",
]

POLL_S = 0.1
GCS_POLL_S = 0.5
GRACE_S = 0.3
HARD_EXIT_S = 2.0

log = logging.getLogger(__name__)

_stop = threading.Event()
_lock = threading.Lock()
_thread: threading.Thread | None = None
_loop: asyncio.AbstractEventLoop | None = None
_lifeline: socket.socket | None = None
_reason: list[Loss] = []
_retired = threading.Event()  # the run ended normally: a closing lifeline is no loss


@dataclass(frozen=True)
class Loss:
    """Why a worker stops calling: ``text`` says it; ``driver`` is True when the run's
    driver is gone, False when only this worker's node is (its raylet died)."""

    text: str
    driver: bool = True


class Lifeline:
    """The driver's end: a listening socket whose connections live as long as it does.

    Workers connect to ``address``; nothing is ever sent. When the driver process
    ends, the kernel closes every connection and each worker reads end-of-file.
    ``host``: 127.0.0.1 for a local Ray, the driver node's address on a cluster.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((host, 0))
        self._server.listen(128)
        self.address: tuple[str, int] = (host, self._server.getsockname()[1])
        self._peers: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="factory-lifeline", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                peer, _ = self._server.accept()
            except OSError:
                return
            self._peers.append(peer)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        # The accept thread first: a connection it accepted while the peers below were
        # being closed would stay open, and that worker would never read end-of-file
        # (seen once in a fast-suite run: the test's lifeline was not cut).
        self._thread.join(timeout=5)
        for peer in self._peers:
            with contextlib.suppress(OSError):
                peer.close()

    def __enter__(self) -> Lifeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_lifeline(address: tuple[str, int]) -> socket.socket | None:
    try:
        sock = socket.create_connection(address, timeout=10)
    except OSError as exc:  # watched by the slower signals only
        log.warning("cannot reach the driver's lifeline %s: %s", address, exc)
        return None
    sock.setblocking(False)
    return sock


def _lifeline_cut() -> bool:
    """Whether the driver's end of the lifeline is closed (read without blocking)."""
    sock = _lifeline
    if sock is None:
        return False
    try:
        data = sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError:  # reset: the peer is gone
        return True
    return data == b""


@dataclass(frozen=True)
class DriverWatch:
    """What a worker knows about its driver when its watcher starts."""

    parent_pid: int  # the raylet that spawned this worker
    driver_pid: int | None  # set only when the driver runs on this node
    driver_create_time: float | None


def loss_reason(
    watch: DriverWatch,
    *,
    parent_pid: int,
    driver_create_time: float | None,
    job_dead: bool,
) -> Loss | None:
    """Why this worker must stop, or None while all is well (a pure function of
    observations).

    ``driver_create_time`` is the create time of the process now holding the
    driver's pid (None when no process holds it): a different time means the
    pid was reused, so the driver is gone all the same. A raylet gone while the
    driver is not known to be is this node's loss, not the driver's: on a cluster
    the driver lives on another node and issues this worker's items again (with a
    local Ray the driver's own death follows, and the lifeline says so first).
    """
    if job_dead:
        return Loss("the driver is gone (its job is marked dead in the GCS)")
    if watch.driver_pid is not None and driver_create_time != watch.driver_create_time:
        return Loss(f"the driver (pid {watch.driver_pid}) is gone")
    if parent_pid != watch.parent_pid:
        return Loss(f"this worker's raylet (pid {watch.parent_pid}) is gone", driver=False)
    return None


def stopped() -> bool:
    """True once this process learnt that its driver is gone."""
    return _stop.is_set()


def check() -> None:
    """Refuse to start a request once the driver is gone (the lifeline is read here,
    synchronously, so no request can start after the driver died).

    Raises:
        Interrupted: the run's driver is gone; this worker is about to exit.
    """
    if not _stop.is_set() and not _retired.is_set() and _lifeline_cut():
        _lost(LIFELINE_LOST)
    if _stop.is_set():
        why = _reason[0].text if _reason else LIFELINE_LOST.text
        raise Interrupted(f"{why}: this worker stops calling")


async def sleep(delay: float) -> None:
    """``asyncio.sleep`` for retry back-off that refuses the next attempt once stopped."""
    await asyncio.sleep(delay)
    check()


def note_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the event loop that stores responses: the process ends on it, between
    two callbacks, so a cache write in progress always completes."""
    global _loop
    _loop = loop


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def _job_info(gcs: object, job_id: str) -> tuple[bool, int, str] | None:
    """(is_dead, driver pid, driver node id) of ``job_id`` from the GCS; None if unknown."""
    try:
        jobs = gcs.get_all_job_info(  # type: ignore[attr-defined]
            job_or_submission_id=job_id,
            skip_submission_job_info_field=True,
            skip_is_running_tasks_field=True,
            timeout=2,
        )
    except Exception:  # GCS unreachable: say nothing (the raylet check covers a dead head)
        return None
    for key, job in jobs.items():
        if key.hex() == job_id:
            return bool(job.is_dead), int(job.driver_pid), job.driver_address.node_id.hex()
    return None


LIFELINE_LOST = Loss("the driver is gone (its lifeline closed)")


def _lost(reason: Loss) -> None:
    """Stop every new request now; the watcher thread ends the process."""
    if not _reason:
        _reason.append(reason)
    _stop.set()


def loss() -> Loss | None:
    """Why this worker stopped, once it did."""
    return _reason[0] if _reason else (LIFELINE_LOST if _stop.is_set() else None)


def retire() -> None:
    """The run ended normally (the driver shuts its workers down): the lifeline that
    closes next is no loss, and the watcher ends without a word. Nothing to do in a
    process that watches nothing (a driver; tests build the actor in-process)."""
    if _thread is not None or _lifeline is not None:
        _retired.set()


def start(lifeline: tuple[str, int] | None = None) -> None:
    """Start this worker's watcher once (no-op in a driver and outside Ray).

    Args:
        lifeline: the driver's ``Lifeline.address`` to connect to, if it has one.
    """
    global _thread, _lifeline
    with _lock:
        if _thread is not None:
            return
        if lifeline is not None and _lifeline is None:
            _lifeline = _connect_lifeline(lifeline)
        try:
            import ray

            if not ray.is_initialized():
                return
            ctx = ray.get_runtime_context()
            if ctx.worker.mode != ray.WORKER_MODE:
                return  # the driver (tests run stages in-process too)
            job_id, node_id = ctx.get_job_id(), ctx.get_node_id()
            gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
        except Exception:  # an unusual Ray set-up: run unwatched rather than not at all
            log.debug("driver watch not started", exc_info=True)
            return
        info = _job_info(gcs, job_id)
        driver_pid = info[1] if info and info[2] == node_id and info[1] else None
        watch = DriverWatch(
            parent_pid=os.getppid(),
            driver_pid=driver_pid,
            driver_create_time=_create_time(driver_pid) if driver_pid else None,
        )
        _thread = threading.Thread(
            target=_watch, args=(watch, gcs, job_id), name="factory-driver-watch", daemon=True
        )
        _thread.start()


def _watch(watch: DriverWatch, gcs: object, job_id: str) -> None:
    next_gcs = 0.0
    job_dead = False
    while True:
        if _stop.is_set():  # a request saw the lifeline cut first
            _shut_down(_reason[0] if _reason else LIFELINE_LOST)
            return
        sock = _lifeline
        if sock is not None:  # sleeps until the driver's end closes (or POLL_S passes)
            with contextlib.suppress(OSError, ValueError):
                select.select([sock], [], [], POLL_S)
            if _lifeline_cut():
                if _retired.is_set():  # a normal end: the driver closed it after shutdown
                    return
                _lost(LIFELINE_LOST)
                _shut_down(LIFELINE_LOST)
                return
        now = time.monotonic()
        if now >= next_gcs:
            info = _job_info(gcs, job_id)
            job_dead = bool(info and info[0])
            next_gcs = now + GCS_POLL_S
        reason = loss_reason(
            watch,
            parent_pid=os.getppid(),
            driver_create_time=_create_time(watch.driver_pid) if watch.driver_pid else None,
            job_dead=job_dead,
        )
        if reason is not None and not _retired.is_set():
            _lost(reason)
            _shut_down(reason)
            return
        if sock is None:
            time.sleep(POLL_S)


def _exit() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def _shut_down(reason: Loss) -> None:
    _stop.set()  # from here on no request starts
    after = "" if reason.driver else "; the driver gives its items to the other workers"
    with contextlib.suppress(Exception):
        print(
            f"factory: {reason.text}; this worker stops calling and exits{after}", file=sys.stderr
        )
    time.sleep(GRACE_S)  # responses already received are stored meanwhile
    loop = _loop
    if loop is not None and not loop.is_closed():
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_exit)
            time.sleep(HARD_EXIT_S)
    _exit()
