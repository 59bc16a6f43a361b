from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.errors import (
    ConfigError,
    LLMBadRequest,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
)
from factory.llm.retry import (
    RetryPolicy,
    call_with_retry,
    must_wait,
    parse_retry_after,
    required_wait,
)

NO_JITTER = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=10.0, jitter=False)


class Recorder:
    """Stands in for asyncio.sleep: records delays, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def scripted(*outcomes: object):
    """An attempt function that raises or returns each outcome in turn."""
    calls: list[int] = []

    async def fn(attempt: int) -> object:
        calls.append(attempt)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)]
)
def test_exponential_backoff_is_capped(attempt: int, expected: float) -> None:
    assert NO_JITTER.delay_for(attempt, None, random.Random(0)) == expected


@settings(max_examples=200)
@given(attempt=st.integers(1, 60), seed=st.integers(0, 2**32))
def test_full_jitter_stays_within_the_exponential_ceiling(attempt: int, seed: int) -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=0.5, max_delay=20.0, jitter=True)
    delay = policy.delay_for(attempt, None, random.Random(seed))
    assert 0.0 <= delay <= min(20.0, 0.5 * 2 ** (attempt - 1))


def test_full_jitter_actually_spreads_delays() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=60.0, jitter=True)
    rng = random.Random(1)
    delays = {round(policy.delay_for(4, None, rng), 6) for _ in range(50)}
    assert len(delays) > 40


@pytest.mark.parametrize("jitter", [False, True])
def test_retry_after_is_honoured_and_capped(jitter: bool) -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=10.0, jitter=jitter)
    rng = random.Random(3)
    delay = policy.delay_for(1, 3.0, rng)
    assert 3.0 <= delay <= 3.3
    assert policy.delay_for(1, 120.0, rng) == 10.0
    assert policy.delay_for(5, 0.0, rng) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"base_delay": -1.0}, "base_delay_s"),
        ({"base_delay": 5.0, "max_delay": 1.0}, "max_delay_s"),
    ],
)
def test_invalid_policy_is_a_config_error(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_backoff_sequence_honours_retry_after() -> None:
    sleep = Recorder()
    retried: list[tuple[int, str, float]] = []
    fn = scripted(
        LLMServerError("500"),
        LLMRateLimited("429", retry_after=7.0),
        LLMTimeout("slow"),
        "done",
    )
    result = asyncio.run(
        call_with_retry(
            fn,
            NO_JITTER,
            sleep=sleep,
            on_retry=lambda n, err, d: retried.append((n, type(err).__name__, d)),
        )
    )
    assert result.value == "done" and result.attempts == 4
    assert fn.calls == [1, 2, 3, 4]
    assert sleep.delays == [1.0, 7.0, 4.0]
    assert retried == [
        (1, "LLMServerError", 1.0),
        (2, "LLMRateLimited", 7.0),
        (3, "LLMTimeout", 4.0),
    ]


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    sleep = Recorder()
    errors = [LLMServerError(f"boom {i}") for i in range(3)]
    policy = RetryPolicy(max_attempts=3, base_delay=0.5, max_delay=10.0, jitter=False)
    with pytest.raises(LLMServerError) as info:
        asyncio.run(call_with_retry(scripted(*errors), policy, sleep=sleep))
    assert info.value is errors[-1]
    assert info.value.attempts == 3  # type: ignore[attr-defined]
    assert sleep.delays == [0.5, 1.0]


@pytest.mark.parametrize("error", [LLMBadRequest("400", status=400), LLMError("generic")])
def test_non_retryable_llm_errors_are_raised_at_once(error: LLMError) -> None:
    sleep = Recorder()
    fn = scripted(LLMServerError("500"), error)
    with pytest.raises(type(error)) as info:
        asyncio.run(call_with_retry(fn, NO_JITTER, sleep=sleep))
    assert info.value.attempts == 2  # type: ignore[attr-defined]
    assert fn.calls == [1, 2] and sleep.delays == [1.0]


def test_programming_errors_are_not_retried() -> None:
    sleep = Recorder()
    fn = scripted(KeyError("bug"), "never")
    with pytest.raises(KeyError):
        asyncio.run(call_with_retry(fn, NO_JITTER, sleep=sleep))
    assert fn.calls == [1] and sleep.delays == []


def test_single_attempt_policy_never_sleeps() -> None:
    sleep = Recorder()
    with pytest.raises(LLMTimeout):
        asyncio.run(
            call_with_retry(scripted(LLMTimeout("t")), RetryPolicy(max_attempts=1), sleep=sleep)
        )
    assert sleep.delays == []


NOW = datetime(2025, 8, 7, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": " 1.5 "}, 1.5),
        ({"Retry-After": format_datetime(NOW + timedelta(seconds=42), usegmt=True)}, 42.0),
        ({"Retry-After": format_datetime(NOW - timedelta(seconds=42), usegmt=True)}, 0.0),
        ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
        ({"retry-after-ms": "nonsense", "Retry-After": "9"}, 9.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-5"}, None),
        ({"Retry-After": ""}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


def test_the_servers_wait_is_marked_as_not_to_be_cut() -> None:
    """While a retry sleeps, ``required_wait`` says how much of it the server asked for
    (a hurried row waits that much and no more); outside a sleep it is 0."""
    seen: list[tuple[float, float]] = []

    async def sleep(delay: float) -> None:
        seen.append((delay, required_wait()))

    fn = scripted(LLMRateLimited("429", retry_after=3.0), LLMServerError("500"), "done")
    policy = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=10.0, jitter=True)
    asyncio.run(call_with_retry(fn, policy, sleep=sleep, rng=random.Random(1)))
    (hinted, hinted_floor), (backoff, backoff_floor) = seen
    assert hinted >= 3.0 and hinted_floor == 3.0  # the hint, without its spread
    assert 0.0 <= backoff <= 2.0 and backoff_floor == 0.0  # jitter only: all of it may go
    assert required_wait() == 0.0
    with must_wait(5.0):
        assert required_wait() == 5.0
    assert required_wait() == 0.0
