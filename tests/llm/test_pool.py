from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from factory.errors import ConfigError, LLMBadRequest, LLMRateLimited, LLMServerError, LLMTimeout
from factory.llm.pool import CircuitState, Endpoint, EndpointPool, Lease, is_endpoint_failure

A = Endpoint("http://a:8000/v1", name="a")
B = Endpoint("http://b:8000/v1", name="b")
C = Endpoint("http://c:8000/v1", name="c")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_pool(
    *endpoints: Endpoint,
    threshold: int = 3,
    cooldown: float = 30.0,
    min_cooldown: float | None = None,
):
    """A pool on a fake clock; the cooldown is fixed (``cooldown``) unless ``min_cooldown``
    asks for the growing one."""
    clock = FakeClock()
    pool = EndpointPool(
        list(endpoints or (A, B, C)),
        failure_threshold=threshold,
        cooldown_s=cooldown,
        min_cooldown_s=cooldown if min_cooldown is None else min_cooldown,
        clock=clock,
    )
    return pool, clock


def names(leases: list[Lease]) -> list[str]:
    return [lease.endpoint.name for lease in leases]


def test_equal_load_is_round_robin() -> None:
    pool, _ = make_pool()
    picked = []
    for _ in range(6):
        lease = pool.acquire()
        picked.append(lease.endpoint.name)
        pool.release(lease, True, 0.1)
    assert picked == ["a", "b", "c", "a", "b", "c"]


def test_least_outstanding_requests_wins() -> None:
    pool, _ = make_pool()
    held = [pool.acquire() for _ in range(3)]  # one on each
    assert names(held) == ["a", "b", "c"]
    pool.release(held[1], True, 0.1)  # b is now idle
    assert pool.acquire().endpoint.name == "b"
    # all at one in flight again -> round robin continues after b
    assert pool.acquire().endpoint.name == "c"


def test_weights_scale_the_share_of_requests() -> None:
    big = Endpoint("http://big:8000/v1", weight=3, name="big")
    small = Endpoint("http://small:8000/v1", name="small")
    pool, _ = make_pool(big, small)
    held = [pool.acquire() for _ in range(8)]
    assert Counter(names(held)) == {"big": 6, "small": 2}


def test_stats_count_requests_failures_latency_and_in_flight() -> None:
    pool, clock = make_pool(A, B)
    first = pool.acquire()
    clock.advance(2.0)
    pool.release(first, False)  # latency measured from acquire
    second = pool.acquire(avoid={"a"})
    stats = pool.stats()
    assert stats["a"].requests == 1 and stats["a"].failures == 1
    assert stats["a"].mean_latency_s == pytest.approx(2.0)
    assert stats["a"].consecutive_failures == 1
    assert stats["b"].in_flight == 1 and stats["b"].mean_latency_s is None
    assert second.endpoint is B
    assert stats["a"].as_dict()["state"] == "closed"


def test_breaker_opens_after_consecutive_failures_only() -> None:
    pool, _ = make_pool(A, B, threshold=3)
    for ok in (False, False, True, False, False):  # a success resets the count
        lease = pool.acquire(avoid={"b"})
        assert lease.endpoint is A
        pool.release(lease, ok, 0.1)
    assert pool.state("a") is CircuitState.CLOSED
    lease = pool.acquire(avoid={"b"})
    pool.release(lease, False, 0.1)
    assert pool.state("a") is CircuitState.OPEN
    assert pool.stats()["a"].times_opened == 1
    # while open, even "avoid b" routes to b
    assert {pool.acquire(avoid={"b"}).endpoint.name for _ in range(4)} == {"b"}


def test_breaker_half_open_probe_then_close() -> None:
    pool, clock = make_pool(A, B, threshold=1, cooldown=30.0)
    pool.release(pool.acquire(), False, 0.1)  # a opens
    assert pool.state("a") is CircuitState.OPEN
    clock.advance(29.9)
    assert pool.state("a") is CircuitState.OPEN
    clock.advance(0.1)
    assert pool.state("a") is CircuitState.HALF_OPEN

    probe = pool.acquire(avoid={"b"})
    assert probe.endpoint is A and probe.probe
    # only one probe at a time: everything else goes to b meanwhile
    assert names([pool.acquire(avoid={"b"}) for _ in range(3)]) == ["b", "b", "b"]
    pool.release(probe, True, 0.2)
    assert pool.state("a") is CircuitState.CLOSED
    nxt = pool.acquire(avoid={"b"})
    assert nxt.endpoint is A and not nxt.probe


def test_failed_probe_reopens_for_a_fresh_cooldown() -> None:
    pool, clock = make_pool(A, B, threshold=1, cooldown=10.0)
    pool.release(pool.acquire(), False, 0.1)
    clock.advance(10.0)
    probe = pool.acquire(avoid={"b"})
    assert probe.probe
    clock.advance(4.0)
    pool.release(probe, False)
    assert pool.state("a") is CircuitState.OPEN
    assert pool.stats()["a"].times_opened == 2
    clock.advance(9.9)
    assert pool.state("a") is CircuitState.OPEN
    clock.advance(0.1)
    assert pool.state("a") is CircuitState.HALF_OPEN


def test_the_cooldown_doubles_per_failed_probe_and_a_close_resets_it() -> None:
    # One endpoint (a provider URL): every request waits for its breaker, so a burst of
    # timeouts must cost a second, not the 30 s a dead endpoint deserves.
    pool, clock = make_pool(A, threshold=1, cooldown=8.0, min_cooldown=1.0)
    pool.release(pool.acquire(), False, 0.1)
    assert pool.wait_s() == pytest.approx(1.0)
    waits = []
    for _ in range(5):  # the endpoint stays down: probes after 1, 2, 4, 8, 8 s
        waited = 0.0
        while pool.state("a") is CircuitState.OPEN:
            clock.advance(0.5)
            waited += 0.5
        waits.append(waited)
        probe = pool.acquire()
        assert probe.probe
        pool.release(probe, False)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
    while pool.state("a") is CircuitState.OPEN:
        clock.advance(0.5)
    pool.release(pool.acquire(), True)  # the probe succeeds: closed
    assert pool.state("a") is CircuitState.CLOSED
    pool.release(pool.acquire(), False)  # opens again from closed: the shortest wait
    clock.advance(0.99)
    assert pool.state("a") is CircuitState.OPEN
    clock.advance(0.01)
    assert pool.state("a") is CircuitState.HALF_OPEN


def test_the_default_first_cooldown_is_a_second_and_bad_values_name_their_key() -> None:
    clock = FakeClock()
    pool = EndpointPool([A], failure_threshold=1, cooldown_s=30.0, clock=clock)
    pool.release(pool.acquire(), False)
    clock.advance(1.0)
    assert pool.state("a") is CircuitState.HALF_OPEN
    with pytest.raises(ConfigError, match="min_cooldown_s") as err:
        EndpointPool([A], cooldown_s=5.0, min_cooldown_s=6.0)
    assert err.value.key_path == "llm.endpoints"


def test_cancelled_probe_gives_no_verdict_and_frees_the_probe_slot() -> None:
    pool, clock = make_pool(A, threshold=1, cooldown=5.0)
    pool.release(pool.acquire(), False, 0.1)
    clock.advance(5.0)
    probe = pool.acquire()
    pool.release(probe, None)
    assert pool.state("a") is CircuitState.HALF_OPEN
    assert pool.acquire().probe


def test_results_from_before_the_breaker_opened_are_not_a_verdict() -> None:
    pool, clock = make_pool(A, threshold=2, cooldown=5.0)
    stale = pool.acquire()  # in flight while the breaker trips
    pool.release(pool.acquire(), False, 0.1)
    pool.release(pool.acquire(), False, 0.1)
    assert pool.state("a") is CircuitState.OPEN
    clock.advance(5.0)
    probe = pool.acquire()
    pool.release(stale, True, 9.0)  # late success must not close the breaker
    assert pool.state("a") is CircuitState.HALF_OPEN
    pool.release(probe, True, 0.1)
    assert pool.state("a") is CircuitState.CLOSED
    assert pool.stats()["a"].in_flight == 0


def test_all_open_raises_a_retryable_error_with_the_wait() -> None:
    pool, clock = make_pool(A, B, threshold=1, cooldown=20.0)
    pool.release(pool.acquire(), False, 0.1)
    clock.advance(5.0)
    pool.release(pool.acquire(), False, 0.1)
    with pytest.raises(LLMServerError, match=r"next probe in 15\.0s") as info:
        pool.acquire()
    assert info.value.retryable


def test_failover_prefers_endpoints_not_yet_tried() -> None:
    pool, _ = make_pool()
    assert pool.acquire(avoid={"a", "b"}).endpoint is C
    # when everything was tried, any healthy endpoint is still better than none
    assert pool.acquire(avoid={"a", "b", "c"}).endpoint.name in {"a", "b", "c"}


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        (LLMServerError("x"), True),
        (LLMTimeout("x"), True),
        (LLMRateLimited("x"), False),
        (LLMBadRequest("x"), False),
        (ValueError("x"), False),
    ],
)
def test_is_endpoint_failure(error: Exception, failure: bool) -> None:
    assert is_endpoint_failure(error) is failure


def test_session_context_manager_infers_the_verdict() -> None:
    pool, _ = make_pool(A, threshold=2)

    async def run() -> None:
        async with pool.session() as lease:
            assert lease.endpoint is A
        for _ in range(2):
            with pytest.raises(LLMServerError):
                async with pool.session():
                    raise LLMServerError("down")

    asyncio.run(run())
    stats = pool.stats()["a"]
    assert (stats.requests, stats.failures, stats.in_flight) == (3, 2, 0)
    assert stats.state is CircuitState.OPEN


def test_session_bad_request_counts_as_a_healthy_answer() -> None:
    pool, _ = make_pool(A, threshold=1)

    async def run() -> None:
        with pytest.raises(LLMBadRequest):
            async with pool.session():
                raise LLMBadRequest("400")

    asyncio.run(run())
    assert pool.state("a") is CircuitState.CLOSED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"endpoints": []}, "at least one endpoint"),
        ({"endpoints": [A, A]}, "listed twice"),
        ({"endpoints": [A], "failure_threshold": 0}, "failure_threshold"),
        ({"endpoints": [A], "cooldown_s": 0}, "cooldown_s"),
    ],
)
def test_pool_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EndpointPool(**kwargs)


@pytest.mark.parametrize(
    ("url", "weight"),
    [("ftp://x/v1", 1), ("not a url", 1), ("http://user:pw@host/v1", 1), ("http://x/v1", 0)],
)
def test_endpoint_config_errors(url: str, weight: int) -> None:
    with pytest.raises(ConfigError):
        Endpoint(url, weight=weight)


def test_endpoint_defaults() -> None:
    ep = Endpoint("http://127.0.0.1:8000/v1/")
    assert ep.name == "http://127.0.0.1:8000/v1"
    assert ep.is_local and ep.api_key_env is None
    assert not Endpoint("https://api.openai.com/v1").is_local
