"""Per-attempt deadlines that follow the latency the endpoint really shows.

Why: ``llm.timeout_s`` must be long enough for the slowest legitimate answer of a
reasoning model (600 s in the shipped recipe), so as the only bound it lets a hung
request (a stalled connection, a lost response) hold its slot for ten minutes per
attempt, up to an hour with six attempts (issue 8). Real answers are heavy-tailed but
bounded in practice: an attempt that runs several times longer than the observed 99th
percentile is almost surely hung, and cancelling and re-sending it costs one attempt
while waiting costs the whole tail.

The policy (``llm.deadline`` in the recipe):

* every successful attempt's latency (send to response) is observed, the last
  ``window`` of them kept;
* once ``min_samples`` are observed, an attempt's deadline is
  ``clamp(p99_factor x p99, floor_s, ceiling_s)`` with ``ceiling_s = llm.timeout_s``;
* before that (a cold start: a judge phase over 40 seeds never gets there) it is
  ``clamp(2 x p99_factor x slowest seen, floor_s, ceiling_s)`` once a few
  (``_COLD_SAMPLES``) answers are in, and ``ceiling_s`` before any: the slowest of a
  few samples underestimates the p99, hence the extra factor 2;
* the deadline of an attempt in flight is re-read while it waits, so attempts started
  cold are cut once the policy has seen enough;
* the whole request (every attempt, backoff and waiting for an endpoint) has its own
  deadline, ``llm.deadline.request_s``;
* an attempt that has run past the observed p95 (and twice the median) while the client
  has spare capacity (the end of a run) is *hedged*: the same request goes out once more
  and the first answer wins (``hedge_after_s``, at most ``hedge_share`` of the attempts).
  Why: the last answers of a run are a heavy tail's lottery (a 6 s draw of a 200 ms
  median kept a 3,000-call phase open for 2 s with one request in flight); a second draw
  is almost surely short. "The Tail at Scale" (Dean and Barroso, 2013).

With a lognormal tail of p99 = 10 x median, a deadline of 4 x p99 cuts about 3 in
10,000 healthy answers (each then costs one retry), and a hung attempt is cut after
``4 x p99`` instead of ``timeout_s``. ``AttemptDeadline`` is pure bookkeeping: no
clock, no I/O; the client measures and asks.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["AttemptDeadline"]

_COLD_SAMPLES = 5


class AttemptDeadline:
    """The deadline of one attempt, from the latencies observed so far.

    Args:
        ceiling_s: the longest an attempt may take (``llm.timeout_s``); also the
            deadline until enough latencies are known.
        floor_s: the shortest deadline the adaptive rule may give.
        p99_factor: deadline = ``p99_factor`` x the observed 99th percentile.
        min_samples: latencies needed before the adaptive rule applies.
        window: latencies kept (the most recent ones), so the rule follows a change.
        adaptive: False keeps ``ceiling_s`` for every attempt (the old behaviour).
        hedge_share: at most this share of the attempts are hedges (0: never hedge).
    """

    def __init__(
        self,
        ceiling_s: float,
        *,
        floor_s: float = 2.0,
        p99_factor: float = 4.0,
        min_samples: int = 50,
        window: int = 2048,
        adaptive: bool = True,
        hedge_share: float = 0.0,
    ) -> None:
        if not ceiling_s > 0 or floor_s < 0 or p99_factor <= 0 or min_samples < 1:
            raise ValueError("deadline parameters must be positive")
        self.ceiling_s = ceiling_s
        self.floor_s = min(floor_s, ceiling_s)
        self.p99_factor = p99_factor
        self.min_samples = min_samples
        self.adaptive = adaptive
        self.hedge_share = hedge_share
        self._samples: deque[float] = deque(maxlen=max(window, min_samples))
        self._since_sort = 0
        self._sorted: list[float] | None = None  # the window, sorted (refreshed lazily)
        self._max: float | None = None  # slowest sample seen (the cold-start rule)
        # Re-sort after this many new samples: a p99 from a window a few percent stale is
        # as good as a fresh one, and sorting 2k floats per answer would cost real CPU.
        self._resort_every = max(1, self._samples.maxlen // 32)  # type: ignore[operator]

    @property
    def observed(self) -> int:
        """Latencies currently in the window."""
        return len(self._samples)

    def observe(self, latency_s: float) -> None:
        """Record the latency of one successful attempt."""
        if latency_s >= 0 and math.isfinite(latency_s):
            self._samples.append(latency_s)
            self._since_sort += 1
            self._max = latency_s if self._max is None else max(self._max, latency_s)
            if self._since_sort >= self._resort_every:
                self._sorted = None

    def p99(self) -> float | None:
        """The 99th percentile of the window (nearest rank), or None when empty."""
        return self.quantile(0.99)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the window (nearest rank), or None when empty."""
        if not self._samples:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._samples)
            self._since_sort = 0
        ordered = self._sorted
        return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]

    def timeout_s(self) -> float:
        """The deadline for an attempt, in seconds after it was sent."""
        n = len(self._samples)
        if not self.adaptive or n < min(_COLD_SAMPLES, self.min_samples):
            return self.ceiling_s
        if n < self.min_samples:
            assert self._max is not None
            return min(self.ceiling_s, max(self.floor_s, 2 * self.p99_factor * self._max))
        p99 = self.p99()
        assert p99 is not None
        return min(self.ceiling_s, max(self.floor_s, self.p99_factor * p99))

    def hedge_after_s(self) -> float | None:
        """Seconds after which an attempt may be hedged: the observed p95 (as "The Tail at
        Scale" defers hedges) and at least twice the median, so a server whose answers all
        take about as long (a fixed latency) is never hedged for its jitter; None: no
        hedging (off, or not enough known)."""
        if not self.adaptive or self.hedge_share <= 0 or len(self._samples) < self.min_samples:
            return None
        p95, median = self.quantile(0.95), self.quantile(0.5)
        assert p95 is not None and median is not None
        return max(p95, 2.0 * median)

    def may_hedge(self, hedges: int, attempts: int) -> bool:
        """Whether one more hedge stays within ``hedge_share`` of the attempts sent."""
        return hedges + 1 <= self.hedge_share * max(attempts, 1)

    def describe(self) -> str:
        """How the current deadline was chosen, for the timeout message."""
        limit = self.timeout_s()
        n = len(self._samples)
        if not self.adaptive or n < min(_COLD_SAMPLES, self.min_samples):
            return f"{limit:.1f}s (llm.timeout_s)"
        if n < self.min_samples:
            return f"{limit:.1f}s (cold start: {n} answers seen, 2 x {self.p99_factor:g} x slowest)"
        return (
            f"{limit:.1f}s ({self.p99_factor:g} x observed p99 {self.p99():.2f}s, "
            f"floor {self.floor_s:g}s, ceiling {self.ceiling_s:g}s)"
        )
