from __future__ import annotations

import asyncio

from factory.llm.limiter import AdaptiveLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_halves_on_overload_once_per_cooldown_and_grows_back() -> None:
    clock = Clock()
    lim = AdaptiveLimiter(32, minimum=2, cooldown_s=1.0, clock=clock)
    lim.on_overload()
    lim.on_overload()  # same burst: counted once
    assert lim.limit == 16 and lim.decreases == 1
    for _ in range(5):
        clock.t += 1.0
        lim.on_overload()
    assert lim.limit == 2  # never below the minimum
    for _ in range(200):
        lim.on_success(0.2)
    assert 2 < lim.limit <= 32


def test_growth_is_capped_at_the_configured_concurrency() -> None:
    lim = AdaptiveLimiter(8)
    for _ in range(100):
        lim.on_success(0.1)
    assert lim.limit == 8


def test_rising_latency_is_an_overload_signal() -> None:
    clock = Clock()
    lim = AdaptiveLimiter(64, clock=clock)
    for _ in range(40):
        lim.on_success(0.2)  # baseline
    assert lim.limit == 64
    for _ in range(40):
        clock.t += 0.1
        lim.on_success(1.5)  # a queueing server: 7.5x slower
    assert lim.limit < 64 and lim.decreases >= 1


def test_one_slow_answer_is_not_an_overload() -> None:
    lim = AdaptiveLimiter(64)
    for _ in range(40):
        lim.on_success(0.2)
    lim.on_success(2.0)
    assert lim.limit == 64 and lim.decreases == 0


def test_acquire_respects_the_current_limit() -> None:
    async def go() -> int:
        lim = AdaptiveLimiter(4)
        lim.on_overload()  # limit 2
        peak = 0

        async def work() -> None:
            nonlocal peak
            await lim.acquire()
            peak = max(peak, lim.in_flight)
            await asyncio.sleep(0.01)
            await lim.release()

        await asyncio.gather(*(work() for _ in range(10)))
        return peak

    assert asyncio.run(go()) == 2
