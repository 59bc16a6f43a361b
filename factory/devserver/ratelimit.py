"""A provider's per-minute budget, as the development server meters it (issue 35, point 5).

Why: real providers refuse beyond a request and a token budget per minute and say how
much is left with every answer; a client that paces itself by those figures has to be
measured against a server that meters and states them the same way. This module is the
pure part: two token buckets and the headers that describe them; the app's chat core
(``factory.devserver.app.serve_chat``) calls :meth:`RateLimiter.admit` once per request,
so every wire format the server speaks is metered alike.

How it meters, after OpenAI's rate-limit guide (platform.openai.com/docs/guides/rate-limits):

- two budgets, requests per minute and tokens per minute, each a bucket refilled
  continuously at ``limit / 60`` per second up to its capacity (OpenAI's headers show it:
  ``x-ratelimit-reset-requests: 12ms`` at 5,000 RPM with one request spent is the 60/5000 s
  one request takes to come back). A request must fit both, or it is refused;
- the capacity is ``limit x window_s / 60``: a full minute by default; a shorter window
  is the guide's "quantized" limit ("60,000 requests/minute may be enforced as 1,000
  requests/second"), which also keeps a benchmark of a few thousand requests about pacing
  rather than about spending one minute's burst;
- a request's token cost is what the guide says is counted at admission: its prompt,
  estimated from its characters (``prompt_tokens``: the server's own estimate, 4
  characters a token), plus its ``max_completion_tokens`` (or ``max_tokens``; none: the
  prompt alone). The guide's sentence ("the maximum of max_tokens and the estimated number
  of tokens based on the character count of your request") is read, as OpenAI's own
  cookbook (``api_request_parallel_processor.py``) reads it, as the sum of the two;
- a refused request costs nothing (the bucket never goes below zero, so a storm of
  refusals cannot starve the requests that wait their ``Retry-After``);
- the headers are the budget as it stood right after the request was admitted (or
  refused), OpenAI's names: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``,
  resets as Go-style durations (``1s``, ``6m0s``, ``59.5ms``); a refusal also carries
  ``Retry-After`` (whole seconds, rounded up) and ``retry-after-ms``: how long until the
  request would fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from factory.errors import ConfigError

__all__ = ["Admission", "RateLimiter", "TokenBucket", "go_duration"]


def go_duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset time (Go's duration format, to the
    microsecond): ``0s``, ``59.5ms``, ``1s``, ``7.66s``, ``6m0s``, ``1h0m0s``."""
    us = max(0, round(seconds * 1_000_000))
    if us == 0:
        return "0s"
    if us < 1_000_000:
        return f"{_trim(us / 1000)}ms"
    hours, rest = divmod(us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    text = f"{_trim(rest / 1_000_000)}s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return text


def _trim(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


class TokenBucket:
    """One budget: ``per_minute`` units refilled continuously, ``window_s`` seconds of
    them held at most; starts full.

    Args:
        per_minute: the limit (what ``x-ratelimit-limit-*`` states).
        window_s: seconds of budget the bucket holds (60: a full minute).
        now: the clock's time at creation.
    """

    def __init__(self, per_minute: float, window_s: float, now: float):
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = self.rate * window_s
        self.level = self.capacity
        self._stamp = now

    def refill(self, now: float) -> None:
        """Add what flowed in since the last look (never above the capacity)."""
        if now > self._stamp:
            self.level = min(self.capacity, self.level + self.rate * (now - self._stamp))
            self._stamp = now

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` fits (0: now; ``inf``: never, it exceeds the capacity)."""
        if cost <= self.level:
            return 0.0
        if cost > self.capacity:
            return math.inf
        return (cost - self.level) / self.rate

    @property
    def window_s(self) -> float:
        """Seconds of budget the bucket holds."""
        return self.capacity / self.rate

    def reset_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``reset``)."""
        return (self.capacity - self.level) / self.rate


@dataclass(frozen=True)
class Admission:
    """The verdict on one request: ``limited`` names the budget that refused it
    (``requests`` or ``tokens``; None: admitted and charged), ``retry_after_s`` how long
    until it would fit, ``headers`` the budget headers for its answer."""

    limited: str | None
    retry_after_s: float
    headers: dict[str, str]


class RateLimiter:
    """A request budget and a token budget per minute (either may be absent).

    Args:
        rpm: requests per minute, or None.
        tpm: tokens per minute, or None.
        window_s: seconds of budget each bucket holds (see the module docstring).
        clock: monotonic seconds (tests inject their own).

    Raises:
        ConfigError: a limit that is not positive, a window that is not positive.
    """

    def __init__(
        self,
        rpm: float | None,
        tpm: float | None,
        *,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        for key, value in (("rate_rpm", rpm), ("rate_tpm", tpm), ("rate_window_s", window_s)):
            if value is not None and not value > 0:
                raise ConfigError(f"must be positive, got {value}", key_path=f"devserver.{key}")
        self._clock = clock
        now = clock()
        self.buckets = {
            name: TokenBucket(limit, window_s, now)
            for name, limit in (("requests", rpm), ("tokens", tpm))
            if limit is not None
        }

    def admit(self, tokens: int) -> Admission:
        """Charge one request of ``tokens`` estimated tokens, or refuse it (charging
        nothing) when either budget lacks room; the headers state both budgets after."""
        now = self._clock()
        costs = {"requests": 1.0, "tokens": float(tokens)}
        limited, wait = None, 0.0
        for name, bucket in self.buckets.items():
            bucket.refill(now)
            need = bucket.wait_s(costs[name])
            if need > wait:
                limited, wait = name, need
        if limited is None:
            for name, bucket in self.buckets.items():
                bucket.level -= costs[name]
        headers: dict[str, str] = {}
        for name, bucket in self.buckets.items():
            headers[f"x-ratelimit-limit-{name}"] = str(int(bucket.limit))
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(bucket.level)))
            headers[f"x-ratelimit-reset-{name}"] = go_duration(bucket.reset_s())
        if limited is not None:
            # A request larger than the whole bucket never fits: say a full window (the
            # provider's "request too large" is a 429 too); the client's retries give up.
            seconds = wait if math.isfinite(wait) else self.buckets[limited].window_s
            headers["retry-after"] = str(max(1, math.ceil(seconds)))
            headers["retry-after-ms"] = str(max(1, math.ceil(seconds * 1000)))
            return Admission(limited, seconds, headers)
        return Admission(None, 0.0, headers)
