"""One run per output prefix on object storage: a lease object the holder renews.

Why not the local folder's ``flock`` (``runstate.OutputLock``): an object store has no
locks, and the heads that may run the same command (a retried ``ray job submit``, a
new head after the first was lost) share nothing but the store. So the run writes
``<prefix>/.lease`` (holder id, host, pid, TTL) with a *conditional* write:

* taking it: ``PUT If-None-Match: *`` creates it only if no lease exists; if one
  exists and has expired, ``PUT If-Match: <its etag>`` replaces exactly the version
  read, so of two runs racing for an expired lease one wins and one is refused;
* holding it: a thread rewrites it with ``If-Match: <our etag>`` every third of its
  TTL, so a live run's lease never expires;
* a crashed holder (``kill -9``, a lost head) stops renewing and its lease expires
  one TTL after its last renewal: the next run takes it over;
* releasing it: ``DELETE If-Match: <our etag>``.

Expiry is judged on the store's clock only: the lease expires when the server's
``Date`` at a read is at least its ``Last-Modified`` plus the TTL the holder wrote,
so hosts whose clocks disagree still agree on who holds the output. A holder that
cannot renew (its renewal finds another version, or the store is unreachable for a
whole TTL) has *lost* the lease and must stop writing (``Lease.lost``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from factory.errors import FactoryError, OutputLocked
from factory.io.objectstore import Blob, PreconditionFailed

__all__ = [
    "DEFAULT_TTL_S",
    "LEASE_FILE",
    "Holder",
    "Lease",
    "LeaseStore",
    "expires_at",
    "is_expired",
    "renew_every",
]

log = logging.getLogger(__name__)

LEASE_FILE = ".lease"
DEFAULT_TTL_S = 60.0


class LeaseStore(Protocol):
    """What a lease needs of a store: conditional whole-object writes (``S3Store``)."""

    def url(self, rel: str) -> str: ...

    def get(self, rel: str) -> Blob: ...

    def put(
        self, rel: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None
    ) -> str: ...

    def delete(self, rel: str, *, if_match: str | None = None) -> None: ...


@dataclass(frozen=True)
class Holder:
    """What the lease object says: who holds the output and for how long a silence lasts."""

    holder: str
    host: str
    pid: int
    started: str
    ttl_s: float

    @classmethod
    def me(cls, ttl_s: float) -> Holder:
        return cls(
            holder=uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            ttl_s=float(ttl_s),
        )

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Holder | None:
        try:
            raw = json.loads(data)
            return cls(
                holder=str(raw["holder"]),
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                started=str(raw["started"]),
                ttl_s=float(raw["ttl_s"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


def expires_at(modified: float, ttl_s: float) -> float:
    """When a lease last written at ``modified`` (server clock) expires."""
    return modified + ttl_s


def is_expired(modified: float, ttl_s: float, server_now: float) -> bool:
    """Whether a lease written at ``modified`` with ``ttl_s`` has expired at ``server_now``
    (all on the store's clock). An unreadable lease counts with a TTL of 0: expired."""
    return server_now >= expires_at(modified, ttl_s)


def renew_every(ttl_s: float) -> float:
    """How often a holder renews: a third of the TTL, so two renewals may fail (a slow
    store, a loaded host) before the lease could expire under a live run."""
    return ttl_s / 3.0


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class Lease:
    """The lease of one output prefix (see module docstring).

    Args:
        store: the output's store (``S3Store`` or a test double with its semantics).
        ttl_s: how long the lease outlives its holder's last renewal.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.me = Holder.me(ttl_s)
        self._clock = clock
        self._etag: str | None = None
        self._renewed = 0.0  # our clock at the last successful write
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- taking and giving back ---------------------------------------------------------------

    def acquire(self) -> str | None:
        """Take the lease or refuse; returns a note when an expired lease was taken over.

        Raises:
            OutputLocked: a live holder has it (the message names it and until when),
                or another run took an expired one first.
            ObjectStoreError: the store refused the write (bucket, credentials).
        """
        body = self.me.encode()
        started = self._clock()
        try:
            self._etag = self.store.put(LEASE_FILE, body, if_absent=True)
            self._renewed = started
            return None
        except PreconditionFailed:
            pass
        try:
            current = self.store.get(LEASE_FILE)
        except FileNotFoundError:  # released between our two requests: try once more
            return self._take(body, None, started)
        other = Holder.decode(current.data)
        ttl = other.ttl_s if other is not None else 0.0
        if not is_expired(current.modified, ttl, current.server_now):
            raise OutputLocked(self._refusal(other, current))
        return self._take(body, current, started, other)

    def _take(
        self, body: bytes, current: Blob | None, started: float, other: Holder | None = None
    ) -> str:
        try:
            if current is None:
                self._etag = self.store.put(LEASE_FILE, body, if_absent=True)
            else:
                self._etag = self.store.put(LEASE_FILE, body, if_match=current.etag)
        except (PreconditionFailed, FileNotFoundError):
            raise OutputLocked(
                f"{self.store.url('')} was just taken by another run starting at the same "
                "time; one output takes one run at a time: wait for it to end, or choose "
                "another --output"
            ) from None
        self._renewed = started
        if other is None or current is None:
            return f"took over {self.store.url(LEASE_FILE)} (it held no readable holder)"
        return (
            f"took over the expired lease of {self.store.url('')} (pid {other.pid} on "
            f"{other.host}, started {other.started}, silent since {_utc(current.modified)}): "
            "that run is gone"
        )

    def _refusal(self, other: Holder | None, current: Blob) -> str:
        who = (
            f"pid {other.pid} on host {other.host}, started {other.started}"
            if other is not None
            else "holder not readable"
        )
        until = _utc(expires_at(current.modified, other.ttl_s if other else 0.0))
        return (
            f"{self.store.url('')} is in use by another run ({who}; its lease runs until "
            f"{until} unless renewed); one output takes one run at a time: wait for that run "
            "to end (or stop it), or choose another --output. A run that dies frees the "
            f"output when its lease expires ({other.ttl_s if other else 0:g} s after its last "
            "renewal)"
        )

    def release(self) -> None:
        """Stop renewing and delete the lease (if still ours); never raises."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self._etag is None or self._lost:
                return
            etag, self._etag = self._etag, None
        try:
            self.store.delete(LEASE_FILE, if_match=etag)
        except PreconditionFailed:  # not ours any more: leave the new holder's alone
            pass
        except (FactoryError, OSError):  # a store without conditional deletes: still ours
            with contextlib.suppress(FactoryError, OSError):
                self.store.delete(LEASE_FILE)

    # -- holding ------------------------------------------------------------------------------

    def renew(self) -> bool:
        """Rewrite the lease if it is still ours; False once it is lost (see ``lost``)."""
        with self._lock:
            if self._lost or self._etag is None:
                return False
            started = self._clock()
            try:
                self._etag = self.store.put(LEASE_FILE, self.me.encode(), if_match=self._etag)
                self._renewed = started
                return True
            except (PreconditionFailed, FileNotFoundError):
                self._lost = (
                    f"the lease of {self.store.url('')} was taken by another run (this run "
                    f"could not renew it within {self.me.ttl_s:g} s)"
                )
            except (FactoryError, OSError) as exc:
                if started - self._renewed < self.me.ttl_s:
                    log.warning("lease renewal failed, retried: %s", exc)
                    return True
                self._lost = (
                    f"the lease of {self.store.url('')} could not be renewed for "
                    f"{self.me.ttl_s:g} s ({exc}): another run may hold the output now"
                )
            log.error("%s", self._lost)
            return False

    def start(self) -> None:
        """Renew in a daemon thread every ``renew_every(ttl)`` until ``release``."""
        every = renew_every(self.me.ttl_s)

        def loop() -> None:
            while not self._stop.wait(every):
                if not self.renew():
                    return

        self._thread = threading.Thread(target=loop, name="factory-lease", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> str | None:
        """Why this run no longer holds the lease, or None while it does."""
        return self._lost

    def check(self) -> None:
        """Raise if the lease was lost: nothing may be written to the output after that.

        Raises:
            OutputLocked: the lease was lost (the message says how).
        """
        if self._lost:
            raise OutputLocked(
                f"{self._lost}; this run stopped writing to it: run the same command again "
                "once the output is free"
            )
