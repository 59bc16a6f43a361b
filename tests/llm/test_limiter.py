from __future__ import annotations

import asyncio
import math
import random

import pytest

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
    for _ in range(400):
        clock.t += 0.01
        lim.on_success(0.2)  # baseline
    assert lim.limit == 64
    for _ in range(400):
        clock.t += 0.01
        lim.on_success(1.5)  # a queueing server: 7.5x slower, sustained
    assert lim.limit < 64 and lim.decreases >= 1


SIGMA_P99_10X = math.log(10) / 2.326  # lognormal with p99 = 10 x median (sigma 0.99)


def _heavy_tailed(rng: random.Random, median: float) -> float:
    return rng.lognormvariate(math.log(median), SIGMA_P99_10X)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_heavy_tailed_latency_never_halves_the_concurrency(seed: int) -> None:
    """Healthy answers of a model whose p99 is 10 x its median (issue 8): their normal
    spread is not queueing. The former rule (block of 20 vs the smallest block median
    seen) halved about 40 times over this stream."""
    rng, clock = random.Random(seed), Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for _ in range(10_000):
        clock.t += 0.01  # ~100 answers/s per actor: the cooldown never hides a halving
        lim.on_success(_heavy_tailed(rng, 0.2))
    assert lim.decreases == 0 and lim.limit == 40


def test_a_sustained_tripling_of_a_heavy_tailed_latency_halves() -> None:
    """A queueing server: the same heavy-tailed latency, three times slower and staying so."""
    rng, clock = random.Random(7), Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for _ in range(2_000):
        clock.t += 0.01
        lim.on_success(_heavy_tailed(rng, 0.2))
    assert lim.decreases == 0
    for _ in range(300):
        clock.t += 0.01
        lim.on_success(_heavy_tailed(rng, 0.6))
    assert lim.decreases >= 1 and lim.limit <= 20


def test_a_short_latency_spike_does_not_halve() -> None:
    """Two slow blocks are not yet a trend: three in a row are needed."""
    clock = Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for latency, n in ((0.2, 500), (2.0, 100), (0.2, 500)):
        for _ in range(n):
            clock.t += 0.01
            lim.on_success(latency)
    assert lim.decreases == 0


def test_a_lasting_latency_level_becomes_the_baseline() -> None:
    """A model that got slower for good (longer answers) is halved a few times, then its
    new latency is the baseline: the limit grows back instead of sitting at the minimum."""
    clock = Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for latency, n in ((0.2, 2_000), (1.0, 8_000)):
        for _ in range(n):
            clock.t += 0.01
            lim.on_success(latency)
    assert 1 <= lim.decreases <= 6 and lim.limit == 40


def test_a_burst_of_refusals_in_a_heavy_tailed_stream_halves() -> None:
    """429s from a provider's overload: a window where most attempts are refused halves,
    whatever the latency of the answers around it."""
    rng, clock = random.Random(3), Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for _ in range(1_000):
        clock.t += 0.01
        lim.on_success(_heavy_tailed(rng, 0.2))
    for _ in range(60):
        clock.t += 0.01
        lim.on_attempt(overloaded=True)
    assert lim.decreases >= 1 and lim.limit <= 20


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
