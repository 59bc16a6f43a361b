"""Per-request deadlines, back-off instead of refusal, retry counting (issue 8).

Pure logic with injected clocks and sleeps, and ``LLMClient`` over a fake SDK (no
HTTP, no Ray): a hung attempt is cut at the adaptive deadline and retried, a
single endpoint whose breaker opened delays its requests instead of failing them,
only attempts that reached the wire are counted, and retries are counted by reason.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from factory import errors
from factory.errors import LLMRateLimited, LLMServerError, LLMTimeout
from factory.llm.backends.openai import SDKTransport
from factory.llm.client import LLMClient
from factory.llm.limiter import AdaptiveLimiter
from factory.llm.pool import CircuitState, Endpoint, EndpointPool
from factory.llm.retry import RetryPolicy
from factory.llm.types import Completion, Request, Usage

MESSAGES = [{"role": "user", "content": "hi"}]
HANG = "hang"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Sleep:
    """Backoff without waiting: records the delay and moves the fake clock on."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.clock.t += delay


def response(text: str = "ok") -> Any:
    return {
        "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        "model": "m",
    }


class ScriptedSDK:
    """Plays a script per call: an exception to raise, ``HANG`` (never answers until
    cancelled) or a text to answer; the last entry repeats."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls = 0
        self.cancelled = 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs: Any) -> Any:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(step, BaseException):
            raise step
        if step == HANG:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return response(step)

    async def close(self) -> None:
        pass


def client(
    sdk: ScriptedSDK,
    *,
    deadline: Any = None,
    attempts: int = 6,
    threshold: int = 5,
    cooldown_s: float = 30.0,
    request_deadline_s: float | None = None,
    clock: Clock | None = None,
    sleep: Sleep | None = None,
    concurrency: int = 8,
    before_send: Any = None,
) -> LLMClient:
    clock = clock or Clock()
    pool = EndpointPool(
        [Endpoint("http://10.0.0.1:8000/v1", name="only")],
        failure_threshold=threshold,
        cooldown_s=cooldown_s,
        min_cooldown_s=cooldown_s,  # a fixed cooldown: these tests time it
        clock=clock,
    )
    # Only new options when a test uses them: the others also run on older clients.
    extra: dict[str, Any] = {}
    if deadline is not None:
        extra["deadline"] = deadline
    if request_deadline_s is not None:
        extra["request_deadline_s"] = request_deadline_s
    if before_send is not None:
        extra["before_send"] = before_send
    return LLMClient(
        pool,
        "m",
        {},
        concurrency=concurrency,
        timeout_s=600.0,
        retry=RetryPolicy(max_attempts=attempts, base_delay=0.5, max_delay=2.0, jitter=False),
        price=None,
        **extra,
        client_factory=lambda e, *a: SDKTransport(e, sdk),
        sleep=sleep or Sleep(clock),
        clock=clock,
    )


def complete(c: LLMClient, rid: str = "r1", guard_s: float = 60.0) -> Completion:
    async def go() -> Completion:
        return await asyncio.wait_for(c.complete(Request.of(rid, MESSAGES)), guard_s)

    return asyncio.run(go())


# ------------------------------------------------------------------ the deadline policy


def test_deadline_is_the_ceiling_until_answers_are_seen_then_k_times_p99_clamped() -> None:
    from factory.llm.deadline import AttemptDeadline

    d = AttemptDeadline(600.0, floor_s=5.0, p99_factor=4.0, min_samples=100)
    assert d.timeout_s() == 600.0  # nothing seen: only timeout_s is known
    for _ in range(5):
        d.observe(2.0)
    assert d.timeout_s() == 2 * 4 * 2.0  # cold start: 2 x k x slowest
    for i in range(200):
        d.observe(10.0 if i % 100 == 0 else 1.0)  # 1% at 10 s
    # 198 x 1 s, 5 x 2 s, 2 x 10 s: the nearest-rank p99 is 2 s
    assert d.p99() == 2.0 and d.timeout_s() == 8.0
    fast = AttemptDeadline(600.0, floor_s=5.0, min_samples=10)
    for _ in range(10):
        fast.observe(0.01)
    assert fast.timeout_s() == 5.0  # the floor
    slow = AttemptDeadline(60.0, floor_s=5.0, min_samples=10)
    for _ in range(10):
        slow.observe(50.0)
    assert slow.timeout_s() == 60.0  # the ceiling (llm.timeout_s)
    fixed = AttemptDeadline(600.0, adaptive=False)
    for _ in range(100):
        fixed.observe(0.1)
    assert fixed.timeout_s() == 600.0


def test_deadline_follows_the_recent_window() -> None:
    from factory.llm.deadline import AttemptDeadline

    d = AttemptDeadline(600.0, floor_s=0.1, p99_factor=4.0, min_samples=10, window=64)
    for _ in range(64):
        d.observe(10.0)
    assert d.timeout_s() == 40.0
    for _ in range(200):
        d.observe(1.0)
    assert d.timeout_s() == 4.0


# ------------------------------------------------------------------ hung attempts


def warmed(floor_s: float = 0.05, hedge_share: float = 0.0) -> Any:
    from factory.llm.deadline import AttemptDeadline

    d = AttemptDeadline(
        600.0, floor_s=floor_s, p99_factor=4.0, min_samples=10, hedge_share=hedge_share
    )
    for _ in range(10):
        d.observe(0.001)
    return d


def test_a_hung_attempt_is_cut_at_its_deadline_and_retried() -> None:
    sdk = ScriptedSDK(HANG, "fine")
    c = client(sdk, deadline=warmed())
    result = complete(c)
    assert result.text == "fine"
    assert result.attempts == 2 and sdk.calls == 2 and sdk.cancelled == 1
    assert result.retries == {"llm_timeout": 1}


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_an_attempt_sent_cold_is_cut_once_the_deadline_is_known() -> None:
    """Sent before any latency was known (deadline = timeout_s = 600 s), it is cut
    within seconds once other answers have shown what normal looks like."""
    from factory.llm.deadline import AttemptDeadline

    hung = ScriptedSDK(HANG, "late but fine")
    deadline = AttemptDeadline(600.0, floor_s=0.05, min_samples=10)
    c = client(hung, deadline=deadline)

    async def go() -> Completion:
        task = asyncio.ensure_future(c.complete(Request.of("cold", MESSAGES)))
        await asyncio.sleep(0.05)
        assert not task.done()
        for _ in range(10):  # answers of other requests arrive
            deadline.observe(0.002)
        return await asyncio.wait_for(task, 30)

    result = asyncio.run(go())
    assert result.text == "late but fine" and hung.cancelled == 1


def test_the_request_deadline_bounds_every_attempt_and_backoff_together() -> None:
    sdk = ScriptedSDK(HANG)
    c = client(sdk, deadline=warmed(floor_s=0.2), attempts=1000, request_deadline_s=1.0)
    with pytest.raises(LLMTimeout) as info:
        complete(c)
    assert 1 <= info.value.attempts <= 6  # type: ignore[attr-defined]
    assert sdk.calls == info.value.attempts  # type: ignore[attr-defined]


# ------------------------------------------------------------------ one endpoint, open breaker


def test_a_single_endpoint_with_an_open_breaker_backs_off_instead_of_failing() -> None:
    """Two 500s open the only breaker; the third attempt waits for the probe instead
    of failing as 'all 1 circuit breakers are open' without being sent."""
    clock = Clock()
    sleep = Sleep(clock)
    sdk = ScriptedSDK(LLMServerError("500", status=500), LLMServerError("500"), "back")
    c = client(sdk, attempts=3, threshold=2, cooldown_s=30.0, clock=clock, sleep=sleep)
    result = complete(c)
    assert result.text == "back"
    assert result.attempts == 3 == sdk.calls  # every counted attempt reached the wire
    assert any(d >= 29.0 for d in sleep.delays)  # waited for the cooldown
    assert c.pool.state("only") is CircuitState.CLOSED  # the probe closed it


def test_attempts_count_only_what_reached_the_wire() -> None:
    clock = Clock()
    sdk = ScriptedSDK(LLMServerError("down"))
    c = client(sdk, attempts=4, threshold=1, cooldown_s=5.0, clock=clock, sleep=Sleep(clock))
    with pytest.raises(LLMServerError) as info:
        complete(c)
    assert info.value.attempts == 4 == sdk.calls  # type: ignore[attr-defined]


def test_never_sent_before_the_request_deadline_is_unavailable_not_failed() -> None:
    clock = Clock()
    sdk = ScriptedSDK(LLMServerError("down"), "never asked")
    c = client(
        sdk, threshold=1, cooldown_s=600.0, request_deadline_s=60.0, clock=clock, sleep=Sleep(clock)
    )
    with pytest.raises(LLMServerError):
        complete(c, "first")  # sent once, failed: opens the breaker for 600 s
    with pytest.raises(errors.LLMUnavailable) as info:
        complete(c, "second")
    assert info.value.attempts == 0 and sdk.calls == 1  # type: ignore[attr-defined]


def test_unavailable_rows_are_unissued_not_failed() -> None:
    from factory.engine.stages.base import UNISSUED, make_row
    from factory.engine.stages.llm_stage import LLMStage
    from factory.llm.backends import LLMRequest, OnlineBackend

    class Stage(LLMStage):
        name = "amplify"
        requires = ()

        async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
            await self.call(row, LLMRequest.of("rid", MESSAGES))
            return row

    class Down(OnlineBackend):
        model = "m"

        async def complete(self, request: Any) -> Completion:
            err = errors.LLMUnavailable("no endpoint")
            err.attempts = 0  # type: ignore[attr-defined]
            raise err

    stage = Stage()
    stage.backend = Down()
    row = asyncio.run(stage.arun_one(make_row()))
    assert row["status"] == UNISSUED and row["reason"] == "llm_unavailable"


def test_a_row_whose_retries_the_run_cut_is_unissued_one_whose_retries_ran_out_is_failed() -> None:
    """Issue 33: an endpoint dies, the run stops (``unreachable``) while rows wait to
    retry; they ended ``failed`` (``llm_server_error``), so the resume never sent them.
    A row whose attempts were cut by the stop is ``unissued`` (the resume sends it; its
    attempts count as calls and its last failure is named); a row that used all of its
    attempts before the stop is ``failed``."""
    from factory.engine.stages.base import FAILED, UNISSUED, make_row
    from factory.engine.stages.llm_stage import record_failure

    class StopOnSecondWait(Sleep):
        async def __call__(self, delay: float) -> None:
            await super().__call__(delay)
            if len(self.delays) >= 2:  # the driver stopped while this row slept
                raise errors.LLMStopped("not tried again: the run stopped (unreachable)")

    clock = Clock()
    sdk = ScriptedSDK(LLMServerError("connection refused"))
    cut = client(sdk, attempts=6, threshold=100, clock=clock, sleep=StopOnSecondWait(clock))
    with pytest.raises(errors.LLMStopped) as info:
        complete(cut, "cut")
    assert info.value.attempts == 2 and sdk.calls == 2  # type: ignore[attr-defined]
    row = make_row()
    info.value.reason = "unreachable"  # what the stage's pause sets: the stop's name
    record_failure(row, "amplify", info.value)
    assert row["status"] == UNISSUED and row["reason"] == "unreachable"
    assert row["calls"] == 1 and "connection refused" in row["message"]

    spent = ScriptedSDK(LLMServerError("connection refused"))
    with pytest.raises(LLMServerError) as failed:
        complete(client(spent, attempts=3, threshold=100), "spent")
    row = make_row()
    record_failure(row, "amplify", failed.value)
    assert row["status"] == FAILED and row["reason"] == "llm_server_error"
    assert spent.calls == 3


# ------------------------------------------------------------------ retries summarised


def test_retries_are_counted_by_reason_and_logged_only_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sdk = ScriptedSDK(
        LLMRateLimited("429", retry_after=0.1), LLMServerError("502"), LLMRateLimited("429"), "ok"
    )
    c = client(sdk)
    with caplog.at_level(logging.INFO, logger="factory"):
        result = complete(c)
    assert result.retries == {"llm_rate_limited": 2, "llm_server_error": 1}
    assert result.attempts == 4
    assert c.retries == {"llm_rate_limited": 2, "llm_server_error": 1}
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


# ------------------------------------------------------------------ the limiter


def test_random_refusals_do_not_collapse_the_concurrency() -> None:
    """A fifth of the attempts refused at random (issue 8's storm): each refused request
    waits its Retry-After; the concurrency stays near the configured one."""
    clock = Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for i in range(2000):
        clock.t += 0.01
        if i % 5 == 0:
            lim.on_attempt(overloaded=True)
        else:
            lim.on_success(0.2)
    assert lim.limit >= 30


def test_mostly_refused_attempts_halve_the_concurrency() -> None:
    clock = Clock()
    lim = AdaptiveLimiter(40, clock=clock)
    for _ in range(200):
        clock.t += 0.1
        lim.on_attempt(overloaded=True)
    assert lim.limit <= 10 and lim.decreases >= 2


def test_a_hung_answer_that_arrives_does_not_look_like_queueing() -> None:
    lim = AdaptiveLimiter(64)
    for _ in range(40):
        lim.on_success(0.2)
    lim.on_success(300.0)  # a stall that finally answered
    for _ in range(40):
        lim.on_success(0.2)
    assert lim.limit == 64 and lim.decreases == 0


# ------------------------------------------------------------------ hedged attempts


def test_hedging_waits_for_the_p99_and_stays_within_its_share() -> None:
    from factory.llm.deadline import AttemptDeadline

    d = AttemptDeadline(600.0, min_samples=10, hedge_share=0.02)
    assert d.hedge_after_s() is None  # nothing known yet
    for i in range(100):
        d.observe(1.0 if i >= 94 else 0.2)
    assert d.hedge_after_s() == 1.0  # the nearest-rank p95 of 94 x 0.2 s and 6 x 1 s
    fixed = AttemptDeadline(600.0, min_samples=10, hedge_share=0.02)
    for i in range(100):
        fixed.observe(0.2 + i / 10000)  # all about 200 ms: the jitter of a fixed latency
    assert fixed.hedge_after_s() == pytest.approx(2 * 0.2049)  # twice the median, not the p95
    assert d.may_hedge(0, 50) and d.may_hedge(1, 100) and not d.may_hedge(2, 100)
    off = AttemptDeadline(600.0, min_samples=10)  # hedge_share 0: never
    for _ in range(100):
        off.observe(0.2)
    assert off.hedge_after_s() is None


def test_a_hedge_takes_only_spare_capacity() -> None:
    """Half the limit in use or anyone waiting for a slot: no hedge (it would take a
    slot a waiting request needs: the middle of a run, not its end)."""

    async def go() -> list[bool]:
        limiter = AdaptiveLimiter(8)
        await limiter.acquire()
        got = [limiter.try_spare()]  # 2 of 8 with it: room
        await limiter.acquire()
        got.append(limiter.try_spare())  # 4 of 8 with it: half, still room
        got.append(limiter.try_spare())  # 5 of 8: more than half
        for _ in range(4):
            await limiter.release()
        small = AdaptiveLimiter(2)
        await small.acquire()
        got.append(small.try_spare())  # 2 of 2
        return got

    assert asyncio.run(go()) == [True, True, False, False]


def test_an_attempt_past_the_p99_is_hedged_and_the_first_answer_wins() -> None:
    sdk = ScriptedSDK(HANG, "second draw")
    c = client(sdk, deadline=warmed(floor_s=30.0, hedge_share=1.0))

    async def go() -> tuple[Completion, int]:
        result = await asyncio.wait_for(c.complete(Request.of("r1", MESSAGES)), 20.0)
        await asyncio.sleep(0.01)  # the hedge's slot is given back by a callback
        return result, c.limiter.in_flight

    result, in_flight = asyncio.run(go())
    assert result.text == "second draw" and sdk.calls == 2 and sdk.cancelled == 1
    assert result.retries == {"hedge": 1} and result.attempts == 2
    assert in_flight == 0


def test_a_hedge_that_answers_with_the_first_attempt_is_paid_and_counted_in_tokens() -> None:
    """Both answers arrived: the first is used, the other was paid too, so the result
    carries both answers' cost and tokens (the ledger counts what the provider bills)."""
    answered = asyncio.Event()

    class BothAnswer(ScriptedSDK):
        async def _create(self, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == 1:
                await answered.wait()  # answers the moment the hedge does
                return response("first")
            answered.set()
            return response("hedge")

    sdk = BothAnswer()
    c = client(sdk, deadline=warmed(floor_s=30.0, hedge_share=1.0))
    result = complete(c)
    assert sdk.calls == 2 and result.retries == {"hedge": 1}
    assert result.text == "first"
    assert result.usage == Usage(input=6, output=2)


def test_usages_of_two_answers_add_up() -> None:
    from factory.llm.backends.openai_wire import usage_from_openai

    a = {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
         "prompt_tokens_details": {"cached_tokens": 8}}  # fmt: skip
    b = {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16,
         "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": None},
         "completion_tokens_details": {"reasoning_tokens": 2}, "model": "x"}  # fmt: skip
    both = usage_from_openai(a) + usage_from_openai(b)
    assert both == Usage(input=20, cached_input=8, output=10, reasoning=2)
    assert (both.uncached_input, both.cached_input, both.output) == (12, 8, 10)


def test_without_spare_capacity_a_slow_attempt_waits_for_its_deadline() -> None:
    sdk = ScriptedSDK(HANG, "fine")
    c = client(sdk, deadline=warmed(floor_s=0.2, hedge_share=1.0), concurrency=2)
    result = complete(c)
    assert result.text == "fine" and result.retries == {"llm_timeout": 1}


def test_no_hedge_goes_out_once_the_driver_is_gone() -> None:
    class DriverGone(Exception):
        pass

    sdk = ScriptedSDK(HANG, "never sent")

    def gone() -> None:  # the driver dies once the first attempt is on the wire
        if sdk.calls:
            raise DriverGone

    c = client(sdk, deadline=warmed(floor_s=30.0, hedge_share=1.0), before_send=gone)
    with pytest.raises(DriverGone):
        complete(c, guard_s=20.0)
    assert sdk.calls == 1 and sdk.cancelled == 1  # the first attempt is cancelled too


def test_an_attempt_that_waited_for_its_slot_is_not_sent_once_the_driver_is_gone() -> None:
    """The driver watch is read again when an attempt holds its slot (waiting for one can
    outlast the driver, as a kill -9 on a loaded machine showed), and the slot is given
    back."""

    class DriverGone(Exception):
        pass

    def gone() -> None:
        raise DriverGone

    sdk = ScriptedSDK("never sent")
    c = client(sdk, before_send=gone, concurrency=1)
    with pytest.raises(DriverGone):
        complete(c, guard_s=20.0)
    assert sdk.calls == 0
    assert c.limiter.in_flight == 0  # the slot was given back
