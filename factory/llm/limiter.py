"""Adaptive concurrency: back off when a server says it is overloaded, grow back when not.

Why: a provider answers an overload with 429s, but a vLLM server queues instead,
so its overload shows only as rising latency. A fixed concurrency either wastes
a healthy server or keeps a struggling one saturated (the 429 storms and
stalls users of other tools report). The limiter does AIMD, as TCP does:

* a 429, a timeout or a 5xx halves the limit (at most once per ``cooldown_s``,
  so one burst of errors counts once);
* a success adds ``1 / limit`` (about +1 per round trip at full use);
* when the smoothed latency (an exponential moving average, so one long answer
  does not count) exceeds ``latency_factor`` x the best smoothed latency seen,
  it is treated like an overload signal (the server is queueing, not serving).

The limit stays within ``[minimum, maximum]``; ``maximum`` is the configured
concurrency, so the limiter only ever lowers what the recipe allows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["AdaptiveLimiter"]


class AdaptiveLimiter:
    """An asyncio concurrency limit that adapts between ``minimum`` and ``maximum``."""

    def __init__(
        self,
        maximum: int,
        *,
        minimum: int = 1,
        latency_factor: float = 3.0,
        cooldown_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.maximum = max(1, maximum)
        self.minimum = max(1, min(minimum, self.maximum))
        self.limit = float(self.maximum)
        self.latency_factor = latency_factor
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._in_flight = 0
        self._cond: asyncio.Condition | None = None
        self._last_decrease = -float("inf")
        self._ewma: float | None = None
        self._best_ewma: float | None = None
        self._samples = 0
        self.decreases = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def acquire(self) -> None:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            while self._in_flight >= int(self.limit):
                await self._cond.wait()
            self._in_flight += 1

    async def release(self) -> None:
        assert self._cond is not None
        async with self._cond:
            self._in_flight -= 1
            free = int(self.limit) - self._in_flight
            if free > 0:
                # Wake only as many waiters as may start: waking all of them on every
                # release costs O(waiters) per call at hundreds of calls per second.
                self._cond.notify(free)

    def on_success(self, latency_s: float) -> None:
        """A completed call: grow, unless the smoothed latency says the server is queueing."""
        self._ewma = latency_s if self._ewma is None else 0.9 * self._ewma + 0.1 * latency_s
        self._samples += 1
        if self._samples >= 20:  # a baseline needs a few samples
            best = self._best_ewma
            self._best_ewma = self._ewma if best is None else min(best, self._ewma)
            if best is not None and self._ewma > self.latency_factor * max(best, 1e-3):
                self.on_overload()
                return
        self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)

    def on_overload(self) -> None:
        """A 429 / timeout / 5xx (or a queueing latency): halve, once per cooldown."""
        now = self._clock()
        if now - self._last_decrease < self.cooldown_s:
            return
        self._last_decrease = now
        self.limit = max(float(self.minimum), self.limit / 2.0)
        self.decreases += 1
