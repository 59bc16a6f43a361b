"""Adaptive concurrency: back off when a server says it is overloaded, grow back when not.

Why: a provider answers an overload with 429s, but a vLLM server queues instead,
so its overload shows only as rising latency. A fixed concurrency either wastes
a healthy server or keeps a struggling one saturated (the 429 storms and
stalls users of other tools report). The limiter does AIMD, as TCP does:

* attempts are judged in windows of ``window`` outcomes: when at least
  ``overload_share`` of a window's attempts were refused (429) or hung (timeout), the
  limit halves (at most once per ``cooldown_s``). A share, not a single 429: a
  provider that refuses a fifth of the requests at random (a per-minute quota, a
  flaky proxy) is not overloaded by our concurrency, and halving on every 429 drove
  the limit to 1 in issue 8's fault storm (2 of 64 connections open); each refused
  request already waits its ``Retry-After``;
* a success adds ``1 / limit`` (about +1 per round trip at full use);
* the median latency of each block of ``window`` successes is compared with the
  best block median seen; ``latency_factor`` x that is an overload signal (the
  server is queueing, not serving). A median, not a mean: one hung answer that
  finally arrives, or the tail of a heavy-tailed model, does not move it.

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
        window: int = 20,
        overload_share: float = 0.5,
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
        self.window = max(1, window)
        self.overload_share = overload_share
        self._latencies: list[float] = []
        self._best_median: float | None = None
        self._outcomes = 0
        self._overloads = 0
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
        """A completed call: grow, unless the block median says the server is queueing."""
        self.on_attempt(overloaded=False)
        self._latencies.append(latency_s)
        if len(self._latencies) >= self.window:
            ordered = sorted(self._latencies)
            median = ordered[len(ordered) // 2]
            self._latencies.clear()
            best = self._best_median
            self._best_median = median if best is None else min(best, median)
            if best is not None and median > self.latency_factor * max(best, 1e-3):
                self.on_overload()
                return
        self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)

    def on_attempt(self, *, overloaded: bool) -> None:
        """Count one attempt's outcome; a window with enough refusals halves the limit."""
        self._outcomes += 1
        self._overloads += overloaded
        if self._outcomes >= self.window:
            if self._overloads >= self.overload_share * self._outcomes:
                self.on_overload()
            self._outcomes = self._overloads = 0

    def on_overload(self) -> None:
        """An overload signal (a window of refusals, a queueing latency): halve, once per
        cooldown."""
        now = self._clock()
        if now - self._last_decrease < self.cooldown_s:
            return
        self._last_decrease = now
        self.limit = max(float(self.minimum), self.limit / 2.0)
        self.decreases += 1
