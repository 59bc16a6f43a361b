"""The pacer: a budget estimate per endpoint from the rate-limit headers, and the wait a
request needs (pure, injected clock); and one client against a rate-limited devserver."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest

from factory.errors import LLMError
from factory.llm.backends.aiohttp import aiohttp_transport
from factory.llm.client import LLMClient
from factory.llm.pacer import Pacer, request_tokens
from factory.llm.pool import Endpoint, EndpointPool
from factory.llm.retry import RetryPolicy
from factory.llm.types import RateLimits, Request


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def rpm(limit: int, remaining: int, reset_s: float | None = None) -> RateLimits:
    if reset_s is None:
        reset_s = (limit - remaining) * 60 / limit  # a full minute's bucket
    return RateLimits(requests_limit=limit, requests_remaining=remaining, requests_reset_s=reset_s)


def test_without_a_stated_budget_nothing_is_paced() -> None:
    pacer = Pacer(clock=Clock())
    pacer.observe("a", None, sent_at=9.0, output_tokens=50)
    pacer.refused("a", 5.0)  # a vLLM server's 429: the retry policy's, not the pacer's
    assert not pacer.active and not pacer.paces("a")
    assert pacer.reserve(["a"], 100) == ("a", 0.0)
    assert pacer.may_send_now("a", 10**9)


def test_requests_wait_in_order_for_the_refill() -> None:
    clock = Clock()
    pacer = Pacer(headroom=0.0, clock=clock)
    pacer.observe("a", rpm(60, 2), sent_at=clock.now)  # 1 a second, 2 left
    assert pacer.active and pacer.paces("a")
    waits = [pacer.reserve(["a"], 0)[1] for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.0, 1.0, 2.0])  # each its own share, no herd
    clock.now += 1.5  # the refill pays the debt as time passes
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(1.5)
    assert pacer.paced == 3 and pacer.waited_s == pytest.approx(4.5)


def test_a_newer_answer_re_bases_minus_what_was_sent_after_it() -> None:
    clock = Clock()
    pacer = Pacer(headroom=0.0, clock=clock)
    pacer.observe("a", rpm(60, 0), sent_at=clock.now)
    for _ in range(3):  # sent at 10, 11, 12 (waits 1, 2, 3 after the refill)
        pacer.reserve(["a"], 0)
    clock.now = 10.5
    # the provider had seen the request sent at 10.2 (and nothing of ours after it) and
    # has 5 left: those 5, less the 3 reserved since, refilled 0.3 s at 1 a second
    pacer.observe("a", rpm(60, 5), sent_at=10.2)
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(0.0)  # 5 - 3 + 0.3 = 2.3 >= 1
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(0.0)
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(0.7)  # 0.3 left: 0.7 s short
    pacer.observe("a", rpm(60, 60), sent_at=10.1)  # an older request's view: ignored
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(1.7)


def test_capacity_is_read_from_the_reset_time_of_a_quantized_limit() -> None:
    """6,000 a minute enforced per second: 100 at most, not 6,000 (OpenAI's guide)."""
    clock = Clock()
    pacer = Pacer(headroom=0.0, clock=clock)
    pacer.observe("a", rpm(6000, 0, reset_s=1.0), sent_at=clock.now)
    clock.now += 60.0  # a long idle minute refills one quantum, not the minute
    waits = [pacer.reserve(["a"], 0)[1] for _ in range(101)]
    assert waits[99] == 0.0 and waits[100] == pytest.approx(0.01)


def test_tokens_are_paced_by_each_request_cost() -> None:
    clock = Clock()
    pacer = Pacer(headroom=0.0, clock=clock)
    limits = RateLimits(tokens_limit=6000, tokens_remaining=1000, tokens_reset_s=50.0)
    pacer.observe("a", limits, sent_at=clock.now)  # 100 tokens a second
    assert pacer.reserve(["a"], 800)[1] == 0.0
    assert pacer.reserve(["a"], 500)[1] == pytest.approx(3.0)  # 300 short


def test_actors_sharing_a_budget_each_take_their_share() -> None:
    clock = Clock()
    pacer = Pacer(actors=4, headroom=0.0, clock=clock)
    pacer.observe("a", rpm(240, 8), sent_at=clock.now)  # 4 a second, 8 left: 1 and 2 each
    waits = [pacer.reserve(["a"], 0)[1] for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.0, 1.0, 2.0])


def test_a_refusal_re_bases_and_holds_the_endpoint_back() -> None:
    clock = Clock()
    pacer = Pacer(headroom=0.0, clock=clock)
    # The first thing a client hears may be a refusal: it states the budget too.
    pacer.refused("a", 2.0, rpm(60, 0), sent_at=clock.now)
    assert pacer.active
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(2.0)  # the Retry-After, not 1 s
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(2.0)  # the refill covers it by then
    assert pacer.reserve(["a"], 0)[1] == pytest.approx(3.0)


def test_the_endpoint_with_room_takes_the_request_and_a_hedge_never_waits() -> None:
    clock = Clock()
    pacer = Pacer(headroom=0.0, clock=clock)
    pacer.observe("a", rpm(60, 0), sent_at=clock.now)
    pacer.observe("b", rpm(60, 1), sent_at=clock.now)
    assert pacer.reserve(["a", "b"], 0) == ("b", 0.0)  # a would wait: b has room
    assert pacer.reserve(["a", "b"], 0) == ("a", pytest.approx(1.0))  # the sooner of the two
    assert pacer.reserve(["a", "c"], 0) == ("c", 0.0)  # c states no budget: not paced
    assert not pacer.may_send_now("b", 0)
    clock.now += 5.0
    assert pacer.may_send_now("b", 0)


def test_a_request_costs_its_prompt_and_its_output_cap() -> None:
    request = Request.of(
        "r", [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 40}]
    )
    assert request_tokens(request, {"max_tokens": 1000}) == 110 + 8 + 1000
    assert request_tokens(request, {"max_completion_tokens": 10}) == 110 + 8 + 10
    assert request_tokens(request, {}, fallback_output=70) == 110 + 8 + 70
    pacer = Pacer()
    pacer.observe("a", None, sent_at=0.0)
    assert pacer.tokens(request, {}, "a") == 118  # no answer yet: the prompt alone


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=10) as resp:
        result: dict[str, Any] = json.loads(resp.read())
    return result


def _send_all(url: str, n: int, *, pace: bool) -> list[Any]:
    client = LLMClient(
        EndpointPool([Endpoint(url)]),
        "factory-dev",
        {"max_tokens": 16},
        concurrency=4,
        timeout_s=30.0,
        retry=RetryPolicy(max_attempts=50, base_delay=0.01, max_delay=0.5),
        price=None,
        client_factory=aiohttp_transport,
        pace=pace,
    )

    async def go() -> list[Any]:
        async with client:
            return await asyncio.gather(
                *(
                    client.complete(Request.of(f"r{i}", [{"role": "user", "content": f"q{i}"}]))
                    for i in range(n)
                ),
                return_exceptions=True,
            )

    return asyncio.run(go())


def test_a_client_paced_by_the_headers_is_hardly_ever_refused(devserver: Any) -> None:
    """50 requests a second, 20 at most at once: the paced client is refused (almost)
    never; the same client without the pacer runs into the budget again and again."""
    n = 60
    for pace in (True, False):
        server = devserver(rate_rpm=3000, rate_window_s=0.4)
        results = _send_all(server.url, n, pace=pace)
        stats = _stats(server.url)
        refused = stats["rate_limited"] / stats["requests"]
        if pace:
            assert not [r for r in results if isinstance(r, LLMError)]
            assert stats["completed"] == n
            assert refused < 0.02, stats
        else:  # some may even run out of attempts
            assert refused > 0.2, stats


def test_headroom_keeps_a_share_of_the_bucket_but_never_blocks_a_large_request() -> None:
    clock = Clock()
    pacer = Pacer(headroom=0.1, clock=clock)
    pacer.observe("a", rpm(600, 100, reset_s=0.0), sent_at=clock.now)  # 10 a second, 100
    waits = [pacer.reserve(["a"], 0)[1] for _ in range(91)]
    assert waits[89] == 0.0 and waits[90] == pytest.approx(0.1)  # 10 kept in reserve
    limits = RateLimits(tokens_limit=600, tokens_remaining=600, tokens_reset_s=0.0)
    pacer.observe("b", limits, sent_at=clock.now)
    assert pacer.reserve(["b"], 590)[1] == 0.0  # only 10 to spare: the request goes now
