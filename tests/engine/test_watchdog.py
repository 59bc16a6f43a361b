"""The worker's driver watch (``factory.engine.watchdog``) without Ray.

The end-to-end kill tests (``tests/e2e/test_resume.py``) show that no request leaves after
the driver is gone; these run the watcher's own steps in this process, with a socket pair
for the lifeline and a fake GCS, so every signal (lifeline, job marked dead, raylet gone,
driver pid reused) and the way out (grace, then the loop's exit) is checked in
milliseconds. The process is never ended: ``_exit`` is replaced.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from factory.engine import watchdog
from factory.errors import Interrupted


class _JobId:
    """A job id as the GCS returns it (hashable, ``hex()``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def hex(self) -> str:
        return self.text


class FakeGcs:
    """``get_all_job_info`` of one job, as Ray's GCS client answers it."""

    def __init__(self, job_id: str, *, dead: bool = False, pid: int = 0, node: str = "n1"):
        self.job_id, self.dead, self.pid, self.node = job_id, dead, pid, node
        self.fail = False

    def get_all_job_info(self, **_: Any) -> dict[Any, Any]:
        if self.fail:
            raise TimeoutError("GCS unreachable")
        key = _JobId(self.job_id)
        address = SimpleNamespace(node_id=SimpleNamespace(hex=lambda: self.node))
        job = SimpleNamespace(is_dead=self.dead, driver_pid=self.pid, driver_address=address)
        return {key: job}


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A watchdog with no lifeline and no stop yet; ``_shut_down`` records its reason."""
    monkeypatch.setattr(watchdog, "_stop", threading.Event())
    monkeypatch.setattr(watchdog, "_reason", [])
    monkeypatch.setattr(watchdog, "_lifeline", None)
    monkeypatch.setattr(watchdog, "_thread", None)
    monkeypatch.setattr(watchdog, "_loop", None)
    monkeypatch.setattr(watchdog, "_retired", threading.Event())
    monkeypatch.setattr(watchdog, "POLL_S", 0.01)
    monkeypatch.setattr(watchdog, "GCS_POLL_S", 0.01)
    reasons: list[str] = []
    monkeypatch.setattr(watchdog, "_shut_down", reasons.append)
    yield reasons


def _watch_in_thread(watch: watchdog.DriverWatch, gcs: FakeGcs) -> threading.Thread:
    thread = threading.Thread(target=watchdog._watch, args=(watch, gcs, gcs.job_id), daemon=True)
    thread.start()
    return thread


def test_the_lifeline_is_cut_when_the_driver_end_closes(fresh: list[str]) -> None:
    with watchdog.Lifeline() as line:
        watchdog._lifeline = watchdog._connect_lifeline(line.address)
        assert watchdog._lifeline is not None
        watchdog.check()  # alive: a request may start
        assert not watchdog._lifeline_cut()
    # the driver's end is closed: the next request is refused, before any network use
    with pytest.raises(Interrupted):
        watchdog.check()
    assert watchdog.stopped() and watchdog._reason == [watchdog.LIFELINE_LOST]
    watchdog._lifeline.close()


def test_a_lifeline_closed_as_a_worker_connects_is_cut_all_the_same(fresh: list[str]) -> None:
    """A connection the driver's accept thread took while its peers were being closed
    stayed open (3% of tries before the fix: the worker would never read end-of-file)."""
    for _ in range(300):
        line = watchdog.Lifeline()
        sock = watchdog._connect_lifeline(line.address)
        assert sock is not None
        watchdog._lifeline = sock
        line.close()
        try:
            assert watchdog._lifeline_cut()
        finally:
            sock.close()


def test_an_unreachable_lifeline_leaves_the_slower_signals() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert watchdog._connect_lifeline(("127.0.0.1", port)) is None


def test_the_watcher_wakes_on_the_lifeline_and_shuts_the_worker_down(fresh: list[str]) -> None:
    ours, drivers = socket.socketpair()
    ours.setblocking(False)
    watchdog._lifeline = ours
    gcs = FakeGcs("j1")
    watch = watchdog.DriverWatch(parent_pid=os.getppid(), driver_pid=None, driver_create_time=None)
    thread = _watch_in_thread(watch, gcs)
    thread.join(0.2)
    assert thread.is_alive() and fresh == []  # nothing is gone yet
    drivers.close()
    thread.join(5)
    assert not thread.is_alive() and fresh == [watchdog.LIFELINE_LOST]
    ours.close()


@pytest.mark.parametrize(
    ("change", "said", "driver"),
    [
        ({"dead": True}, "the driver is gone (its job is marked dead in the GCS)", True),
        ({"parent_pid": -1}, "this worker's raylet (pid -1) is gone", False),
        ({"driver_create_time": -1.0}, "the driver (pid {pid}) is gone", True),
    ],
    ids=["job-dead", "raylet-gone", "driver-pid-reused"],
)
def test_without_a_lifeline_the_slower_signals_shut_it_down(
    fresh: list[watchdog.Loss], change: dict[str, Any], said: str, driver: bool
) -> None:
    """Each signal stops the worker; only the driver's own signals say the driver is gone
    (a raylet gone is this node's loss: on a cluster the driver lives on)."""
    gcs = FakeGcs("j2", dead=change.get("dead", False))
    gcs.fail = "dead" not in change  # an unreachable GCS says nothing either way
    watch = watchdog.DriverWatch(
        parent_pid=change.get("parent_pid", os.getppid()),
        driver_pid=os.getpid(),  # the "driver" is this process: its create time is known
        driver_create_time=change.get("driver_create_time", watchdog._create_time(os.getpid())),
    )
    thread = _watch_in_thread(watch, gcs)
    thread.join(5)
    assert not thread.is_alive()
    assert fresh == [watchdog.Loss(said.format(pid=os.getpid()), driver=driver)]
    with pytest.raises(Interrupted, match="stops calling") as raised:
        watchdog.check()
    assert ("driver" in str(raised.value)) is driver


def test_a_retired_worker_takes_its_lifeline_closing_as_no_loss(fresh: list[Any]) -> None:
    """A normal end (the driver shut the workers down, then closed the lifeline): the
    watcher ends without stopping or saying anything (issue 39: every run's log ended
    with "the driver is gone")."""
    with watchdog.Lifeline() as line:
        watchdog._lifeline = watchdog._connect_lifeline(line.address)
        watch = watchdog.DriverWatch(
            parent_pid=os.getppid(), driver_pid=None, driver_create_time=None
        )
        thread = _watch_in_thread(watch, FakeGcs("j9"))
        watchdog.retire()
    thread.join(5)
    assert not thread.is_alive() and fresh == [] and not watchdog.stopped()
    watchdog.check()  # no loss: nothing raised
    assert watchdog._lifeline is not None
    watchdog._lifeline.close()


def test_a_stop_seen_by_a_request_first_is_the_reason_given(fresh: list[str]) -> None:
    first = watchdog.Loss("the run's driver is gone (seen by a request)")
    watchdog._lost(first)
    watchdog._lost(watchdog.Loss("a second reason is not kept"))
    watch = watchdog.DriverWatch(parent_pid=os.getppid(), driver_pid=None, driver_create_time=None)
    _watch_in_thread(watch, FakeGcs("j3")).join(5)
    assert fresh == [first]


def test_job_info_reads_the_gcs_answer_and_says_nothing_when_it_cannot() -> None:
    gcs = FakeGcs("j4", dead=True, pid=123, node="abc")
    assert watchdog._job_info(gcs, "j4") == (True, 123, "abc")
    assert watchdog._job_info(gcs, "another job") is None
    gcs.fail = True
    assert watchdog._job_info(gcs, "j4") is None
    assert watchdog._create_time(2**22 + 12345) is None  # no such process


def test_shut_down_ends_the_process_on_its_loop_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exit runs as a callback of the loop that stores responses (never inside a cache
    write), after the grace; a stuck loop is ended from the thread."""
    monkeypatch.setattr(watchdog, "_stop", threading.Event())
    monkeypatch.setattr(watchdog, "GRACE_S", 0.0)
    # The loop's thread must get the CPU before the hard exit: with 0 s a busy machine
    # ran the thread's exit first (1 of 4 runs of the fast suite, 2026-11-26).
    monkeypatch.setattr(watchdog, "HARD_EXIT_S", 1.0)
    exits: list[str] = []
    loop = asyncio.new_event_loop()
    try:
        here = threading.current_thread
        monkeypatch.setattr(watchdog, "_exit", lambda: exits.append(here().name))
        watchdog.note_loop(loop)
        ran = threading.Thread(target=loop.run_forever, name="the-loop", daemon=True)
        ran.start()
        watchdog._shut_down(watchdog.Loss("gone"))
        loop.call_soon_threadsafe(loop.stop)
        ran.join(5)
        assert watchdog.stopped()
        assert exits[0] == "the-loop"  # on the loop first, then the thread's hard exit
        assert exits[-1] == threading.current_thread().name
    finally:
        loop.close()
        monkeypatch.setattr(watchdog, "_loop", None)


def test_start_outside_a_ray_worker_watches_nothing(fresh: list[str]) -> None:
    watchdog.start(lifeline=None)  # a driver, or no Ray: nothing to watch
    assert watchdog._thread is None and not watchdog.stopped()
