"""Adaptive concurrency: back off when a server says it is overloaded, grow back when not.

Why: a provider answers an overload with 429s, but a vLLM server queues instead,
so its overload shows only as rising latency. A fixed concurrency either wastes
a healthy server or keeps a struggling one saturated (the 429 storms and
stalls users of other tools report). The limiter does AIMD, as TCP does, and it
lowers the limit only on a real overload signal:

* attempts are judged in windows of ``window`` outcomes: when at least
  ``overload_share`` of a window's attempts were refused (429) or hung (timeout), the
  limit halves (at most once per ``cooldown_s``). A share, not a single 429: a
  provider that refuses a fifth of the requests at random (a per-minute quota, a
  flaky proxy) is not overloaded by our concurrency, and halving on every 429 drove
  the limit to 1 in issue 8's fault storm (2 of 64 connections open); each refused
  request already waits its ``Retry-After``;
* a success adds ``1 / limit`` (about +1 per round trip at full use);
* latency: the median of each block of ``latency_block`` successes is compared with a
  robust baseline, the median of the last ``baseline_blocks`` block medians (a long
  window: ``latency_block x baseline_blocks`` answers). Only ``confirm_blocks``
  consecutive blocks above ``latency_factor`` x the baseline count as a queueing
  server, and halve the limit. Real model latencies are heavy-tailed (lognormal with
  p99 = 10 x median): the median of 20 answers then varies by +-30% and the smallest
  of many such medians is about half the true one, so the former rule ("a block median
  above 3 x the smallest block median seen") fired on ordinary blocks and halved the
  limit about 40 times per 10,000 answers, keeping 16 of 64 server slots busy (issue 8,
  measured). A block of 50 has a median within +-20% of the true one; a baseline that
  is a median of medians cannot be dragged down by one lucky block; requiring three
  blocks in a row rules out chance. A sustained inflation that outlives the baseline
  window becomes the new baseline (a slower model, longer answers): halving is for a
  change, not for a level.
* medians, never means: one hung answer that finally arrives, or the tail of a
  heavy-tailed model, does not move them.

The limit stays within ``[minimum, maximum]``; ``maximum`` is the configured
concurrency, so the limiter only ever lowers what the recipe allows.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable

__all__ = ["AdaptiveLimiter"]


class AdaptiveLimiter:
    """An asyncio concurrency limit that adapts between ``minimum`` and ``maximum``.

    Args:
        maximum: the configured concurrency (the limit starts there).
        minimum: the limit never goes below this.
        latency_factor: a block median this many times the baseline is inflated.
        cooldown_s: at most one halving per this many seconds.
        window: attempts per refusal window.
        overload_share: share of a window's attempts refused or hung that halves.
        latency_block: successes per latency block.
        baseline_blocks: block medians the baseline is the median of.
        confirm_blocks: consecutive inflated blocks that halve the limit.
        clock: monotonic seconds (tests inject their own).
    """

    def __init__(
        self,
        maximum: int,
        *,
        minimum: int = 1,
        latency_factor: float = 2.0,
        cooldown_s: float = 1.0,
        window: int = 20,
        overload_share: float = 0.5,
        latency_block: int = 50,
        baseline_blocks: int = 32,
        confirm_blocks: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.maximum = max(1, maximum)
        self.minimum = max(1, min(minimum, self.maximum))
        self.limit = float(self.maximum)
        self.latency_factor = latency_factor
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._in_flight = 0
        self._waiting = 0  # requests waiting in ``acquire``
        self._cond: asyncio.Condition | None = None
        self._last_decrease = -float("inf")
        self.window = max(1, window)
        self.overload_share = overload_share
        self.latency_block = max(1, latency_block)
        self.confirm_blocks = max(1, confirm_blocks)
        self._latencies: list[float] = []
        self._medians: deque[float] = deque(maxlen=max(1, baseline_blocks))
        self._inflated = 0  # consecutive inflated blocks
        self._outcomes = 0
        self._overloads = 0
        self.decreases = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def baseline(self) -> float | None:
        """The latency baseline (median of the recent block medians), or None while
        fewer than ``confirm_blocks`` blocks are known."""
        if len(self._medians) < self.confirm_blocks:
            return None
        return statistics.median(self._medians)

    async def acquire(self) -> None:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            self._waiting += 1
            try:
                while self._in_flight >= int(self.limit):
                    await self._cond.wait()
            finally:
                self._waiting -= 1
            self._in_flight += 1

    def try_spare(self) -> bool:
        """Take a slot only from spare capacity: nobody waits for one and at most half of
        the limit is in use (the end of a run, not a moment's gap between two requests).
        For hedged requests (``factory.llm.client``); give it back with ``release``."""
        if self._waiting or 2 * (self._in_flight + 1) > int(self.limit):
            return False
        self._in_flight += 1
        return True

    async def release(self) -> None:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            self._in_flight -= 1
            free = int(self.limit) - self._in_flight
            if free > 0:
                # Wake only as many waiters as may start: waking all of them on every
                # release costs O(waiters) per call at hundreds of calls per second.
                self._cond.notify(free)

    def on_success(self, latency_s: float) -> None:
        """A completed call: grow, unless the latency blocks say the server is queueing."""
        self.on_attempt(overloaded=False)
        self._latencies.append(latency_s)
        if len(self._latencies) >= self.latency_block and self._judge_block():
            self.on_overload()
            return
        self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)

    def _judge_block(self) -> bool:
        """Close the current latency block; True when it confirms a sustained inflation."""
        median = statistics.median(self._latencies)
        self._latencies.clear()
        baseline = self.baseline()
        self._medians.append(median)
        if baseline is None or median <= self.latency_factor * max(baseline, 1e-3):
            self._inflated = 0
            return False
        self._inflated += 1
        if self._inflated < self.confirm_blocks:
            return False
        self._inflated = 0  # the next halving needs a fresh confirmation
        return True

    def on_attempt(self, *, overloaded: bool) -> None:
        """Count one attempt's outcome; a window with enough refusals halves the limit."""
        self._outcomes += 1
        self._overloads += overloaded
        if self._outcomes >= self.window:
            if self._overloads >= self.overload_share * self._outcomes:
                self.on_overload()
            self._outcomes = self._overloads = 0

    def on_overload(self) -> None:
        """An overload signal (a window of refusals, a confirmed queueing latency):
        halve, once per cooldown."""
        now = self._clock()
        if now - self._last_decrease < self.cooldown_s:
            return
        self._last_decrease = now
        self.limit = max(float(self.minimum), self.limit / 2.0)
        self.decreases += 1
