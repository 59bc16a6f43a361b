"""The lease of an output on object storage (factory/io/lease.py).

The decisions (who may take the lease, when it has expired, when a holder renews, when it
has lost it) run against an in-memory store with S3's conditional-write semantics and a
clock the test moves; one test takes and takes over a lease on a real S3-compatible server
(moto on 127.0.0.1), whose conditional writes are the ones the lease relies on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from factory.errors import OutputLocked
from factory.io.lease import LEASE_FILE, Holder, Lease, expires_at, is_expired, renew_every
from factory.io.objectstore import Blob, ObjectStoreError, PreconditionFailed, S3Store
from tests.helpers import s3


@dataclass
class FakeStore:
    """One bucket in memory: ETags, conditional PUT/DELETE, the server's clock (``now``)."""

    now: float = 1000.0
    objects: dict[str, tuple[bytes, str, float]] = field(default_factory=dict)
    failing: bool = False  # the store is unreachable
    version: int = 0

    def url(self, rel: str) -> str:
        return f"s3://bkt/out/{rel}"

    def get(self, rel: str) -> Blob:
        if self.failing:
            raise ObjectStoreError(self.url(rel), "unreachable")
        if rel not in self.objects:
            raise FileNotFoundError(rel)
        data, etag, modified = self.objects[rel]
        return Blob(data, etag, modified, self.now)

    def put(
        self, rel: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None
    ) -> str:
        if self.failing:
            raise ObjectStoreError(self.url(rel), "unreachable")
        current = self.objects.get(rel)
        if if_absent and current is not None:
            raise PreconditionFailed(rel)
        if if_match is not None and (current is None or current[1] != if_match):
            raise PreconditionFailed(rel)
        self.version += 1
        etag = f'"v{self.version}"'
        self.objects[rel] = (data, etag, self.now)
        return etag

    def delete(self, rel: str, *, if_match: str | None = None) -> None:
        current = self.objects.get(rel)
        if if_match is not None and current is not None and current[1] != if_match:
            raise PreconditionFailed(rel)
        self.objects.pop(rel, None)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_expiry_is_judged_on_the_servers_clock() -> None:
    assert expires_at(100.0, 60.0) == 160.0
    assert not is_expired(100.0, 60.0, 159.9)
    assert is_expired(100.0, 60.0, 160.0)
    # a holder renews three times per TTL: two renewals may fail before it could expire
    assert renew_every(60.0) == 20.0 and 2 * renew_every(60.0) < 60.0


def test_a_live_lease_refuses_a_second_run_naming_its_holder_and_until_when() -> None:
    store = FakeStore()
    first = Lease(store, ttl_s=30)
    assert first.acquire() is None
    held = Holder.decode(store.objects[LEASE_FILE][0])
    assert held == first.me
    store.now += 29.0  # one second before it would expire
    with pytest.raises(OutputLocked) as refused:
        Lease(store, ttl_s=30).acquire()
    text = str(refused.value)
    assert f"pid {first.me.pid} on host {first.me.host}" in text
    assert "until 1970-01-01T00:17:10Z" in text  # written at 1000 s + 30 s TTL
    assert Holder.decode(store.objects[LEASE_FILE][0]) == first.me  # untouched


def test_a_crashed_holders_lease_expires_and_is_taken_over() -> None:
    store = FakeStore()
    crashed = Lease(store, ttl_s=10)
    crashed.acquire()  # and then never renews: kill -9
    store.now += 10.0
    second = Lease(store, ttl_s=60)
    note = second.acquire()
    assert note is not None and "took over the expired lease" in note
    assert f"pid {crashed.me.pid}" in note
    assert Holder.decode(store.objects[LEASE_FILE][0]) == second.me
    # the crashed holder, were it only paused, finds out at its next renewal
    assert crashed.renew() is False and crashed.lost
    with pytest.raises(OutputLocked, match="taken by another run"):
        crashed.check()
    crashed.release()  # gives back nothing that is not its own
    assert Holder.decode(store.objects[LEASE_FILE][0]) == second.me


def test_of_two_runs_racing_for_an_expired_lease_one_wins() -> None:
    store = FakeStore()
    Lease(store, ttl_s=5).acquire()
    store.now += 6
    a, b = Lease(store), Lease(store)
    stale = store.get(LEASE_FILE)  # both read the expired lease ...
    a.acquire()  # ... a replaces it first
    with pytest.raises(OutputLocked, match="just taken by another run"):
        b._take(b.me.encode(), stale, 0.0)  # b's If-Match names the version a replaced


def test_renewal_keeps_the_lease_and_survives_a_short_outage_but_not_a_whole_ttl() -> None:
    store, clock = FakeStore(), Clock()
    lease = Lease(store, ttl_s=30, clock=clock)
    lease.acquire()
    for _ in range(5):  # a live run's lease never expires
        clock.t += renew_every(30)
        store.now += renew_every(30)
        assert lease.renew()
        assert not is_expired(store.get(LEASE_FILE).modified, 30, store.now)
    store.failing = True
    clock.t += 20  # under a TTL since the last renewal: retried, still held
    assert lease.renew() and lease.lost is None
    clock.t += 15  # a whole TTL without a renewal: someone may hold it now
    assert lease.renew() is False
    assert lease.lost is not None and "could not be renewed" in lease.lost


def test_release_deletes_the_lease_only_while_it_is_ours() -> None:
    store = FakeStore()
    lease = Lease(store, ttl_s=30)
    lease.acquire()
    lease.release()
    assert LEASE_FILE not in store.objects
    Lease(store).acquire()  # the output is free at once, no waiting for an expiry


def test_conditional_writes_of_a_real_s3_server_take_and_take_over_the_lease() -> None:
    bucket = s3.new_bucket()
    store = S3Store(f"s3://{bucket}/out", s3.client())
    # 3 s, not 1: HTTP dates have whole seconds, so a 1 s lease could read as expired at
    # once on a loaded machine (seen in CI: the second acquire took it over).
    first = Lease(store, ttl_s=3)
    assert first.acquire() is None
    with pytest.raises(OutputLocked, match="in use by another run"):
        Lease(S3Store(f"s3://{bucket}/out", s3.client()), ttl_s=60).acquire()
    # First-run expiry on the server's clock (Last-Modified has whole seconds).
    deadline = time.time() + 30
    while not is_expired(store.get(LEASE_FILE).modified, 3, store.get(LEASE_FILE).server_now):
        assert time.time() < deadline
        time.sleep(0.2)
    second = Lease(S3Store(f"s3://{bucket}/out", s3.client()), ttl_s=60)
    assert "took over" in (second.acquire() or "")
    assert first.renew() is False  # If-Match on the replaced version: 412
    second.release()
    assert LEASE_FILE not in store.list()
