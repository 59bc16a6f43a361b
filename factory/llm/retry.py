"""Retrying retryable LLM failures with capped exponential backoff and full jitter.

Full jitter (a delay drawn uniformly from ``[0, min(max_delay, base * 2**n)]``)
spreads out the thousands of requests a Ray stage has in flight, which all hit
the same rate limit at the same moment; see "Exponential Backoff And Jitter"
(AWS Architecture Blog, 2015). When the server says how long to wait
(``Retry-After`` on a 429) that wins over the computed delay, with a little
jitter on top so the herd does not come back in the same millisecond.

Only ``LLMTimeout``, ``LLMRateLimited`` and ``LLMServerError`` are retried; a
bad request fails the same way every time and is raised at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Generic, TypeVar

from factory.errors import ConfigError, LLMError, LLMRateLimited, LLMServerError, LLMTimeout

__all__ = [
    "RETRYABLE",
    "RetryPolicy",
    "RetryResult",
    "call_with_retry",
    "must_wait",
    "parse_retry_after",
    "required_wait",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE: tuple[type[LLMError], ...] = (LLMTimeout, LLMRateLimited, LLMServerError)

# Retry-After jitter: up to this fraction of the server's hint is added.
_RETRY_AFTER_SPREAD = 0.1

# The part of the current sleep the server asked for (a ``Retry-After``, an open
# circuit breaker's cool-down): a sleep that may be cut short (a row the driver hurries,
# ``factory.engine.stages.llm_stage``) still waits this long. A context variable, so the
# ``sleep(delay)`` callables every backend takes keep their one-argument shape.
_REQUIRED_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar("required_wait", default=0.0)


@contextlib.contextmanager
def must_wait(seconds: float) -> Iterator[None]:
    """Within this block, a sleep cut short still lasts ``seconds`` (the server's word)."""
    token = _REQUIRED_WAIT.set(max(0.0, seconds))
    try:
        yield
    finally:
        _REQUIRED_WAIT.reset(token)


def required_wait() -> float:
    """Seconds of the current sleep that no hurry may cut (0: all of it may go)."""
    return _REQUIRED_WAIT.get()


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one request.

    Attributes:
        max_attempts: attempts in total, the first one included (1 = never retry).
        base_delay: seconds before the first retry, doubled per attempt, before jitter.
        max_delay: cap on any single delay, including a server's ``Retry-After``.
        jitter: draw the delay uniformly from [0, computed] ("full jitter").
    """

    max_attempts: int = 6
    base_delay: float = 1.0
    max_delay: float = 60.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("must be at least 1", key_path="llm.retry.max_attempts")
        if self.base_delay < 0:
            raise ConfigError("must not be negative", key_path="llm.retry.base_delay_s")
        if self.max_delay < self.base_delay:
            raise ConfigError("must be at least base_delay_s", key_path="llm.retry.max_delay_s")

    def delay_for(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        Args:
            attempt: the attempt that just failed; the first retry follows attempt 1.
            retry_after: the server's hint in seconds, if it gave one.
            rng: source of jitter (inject a seeded one for reproducible tests).

        Returns:
            A delay in ``[0, max_delay]``; never shorter than ``retry_after`` unless capped.
        """
        if retry_after is not None and retry_after >= 0:
            spread = rng.uniform(0, retry_after * _RETRY_AFTER_SPREAD) if self.jitter else 0.0
            return min(self.max_delay, retry_after + spread)
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** max(0, attempt - 1))
        return rng.uniform(0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True)
class RetryResult(Generic[T]):
    """The value of the successful attempt and how many attempts it took."""

    value: T
    attempts: int


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds to wait according to a response's headers, or ``None`` without a usable hint.

    Reads ``retry-after-ms`` (OpenAI's millisecond variant) first, then
    ``Retry-After`` as delta-seconds or an HTTP date (RFC 9110 §10.2.3). A date in
    the past means "now" (0.0). Header names are matched case-insensitively.

    Args:
        headers: response headers.
        now: the current time for HTTP dates (tests pin it); default: the UTC clock.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
            if value >= 0:
                return value
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if raw is None or not raw.strip():
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        return seconds if seconds >= 0 else None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    current = now or datetime.now(timezone.utc)
    return max(0.0, (when - current).total_seconds())


def _record_attempts(exc: BaseException, attempts: int) -> None:
    # Carried as an attribute so the failed-row record can say "after 6 attempts".
    exc.attempts = attempts  # type: ignore[attr-defined]


async def call_with_retry(
    fn: Callable[[int], Awaitable[T]],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    on_retry: Callable[[int, LLMError, float], object] | None = None,
    rng: random.Random | None = None,
    give_up_at: float | None = None,
    clock: Callable[[], float] | None = None,
) -> RetryResult[T]:
    """Await ``fn(attempt)`` until it succeeds, retrying retryable LLM errors.

    Args:
        fn: makes one attempt; receives the 1-based attempt number (so it can fail
            over to another endpoint or log it).
        policy: attempt count and backoff.
        sleep: awaited with each delay; tests inject a recorder instead of waiting.
        on_retry: called as ``on_retry(attempt, error, delay)`` before each sleep.
        rng: jitter source (default: a fresh ``random.Random()``).
        give_up_at: the request's overall deadline on ``clock``: no retry starts whose
            backoff would end after it (the last error is raised instead).
        clock: monotonic seconds for ``give_up_at``.

    Returns:
        The value and the number of attempts used.

    Raises:
        LLMError: the last retryable error after ``max_attempts``, or the first
            non-retryable one; either carries ``.attempts``. Non-LLM exceptions
            propagate unchanged at once (they are bugs, not transport weather).
    """
    rng = rng or random.Random()
    attempt = 1
    while True:
        try:
            value = await fn(attempt)
        except RETRYABLE as exc:
            if attempt >= policy.max_attempts:
                _record_attempts(exc, attempt)
                raise
            retry_after = exc.retry_after if isinstance(exc, LLMRateLimited) else None
            delay = policy.delay_for(attempt, retry_after, rng)
            if give_up_at is not None and clock is not None and clock() + delay >= give_up_at:
                _record_attempts(exc, attempt)
                raise
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            with must_wait(min(delay, retry_after or 0.0)):
                await sleep(delay)
            attempt += 1
        except LLMError as exc:
            _record_attempts(exc, attempt)
            raise
        else:
            return RetryResult(value=value, attempts=attempt)
