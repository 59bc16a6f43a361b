"""Pacing requests by the provider's own budget, before it refuses (issue 35, point 5).

Why: a provider meters requests and tokens per minute and states, with every answer,
how much of each is left and when it is full again (OpenAI's ``x-ratelimit-*``,
Anthropic's ``anthropic-ratelimit-*``, read by each backend into the neutral
``RateLimits``). The adaptive limiter (``factory.llm.limiter``) only reacts once the
provider has refused: at a budget below what the client could send, it keeps sending
into 429s, each costing a round trip and a ``Retry-After``. The pacer instead keeps an
estimate of each endpoint's budget and holds a request back until the estimate says it
fits, so the budget is spent at the rate it refills and hardly anything is refused.

The estimate, per endpoint and per budget (requests; tokens):

- **a token bucket with debt** (GCRA): a request *reserves* its cost at once, driving the
  level below zero when the budget is short, and waits until the refill (``limit / 60``
  per second: the limits are per minute) has paid the debt. Requests so queue in order,
  each waiting only its own share; none wakes at the same moment as all the others to
  find the same budget.
- **re-based on every newer answer**: an answer's ``remaining`` is the budget as the
  provider saw it when it admitted that request; the level is re-set to it, minus what
  was reserved for requests sent after that one (the provider had not seen them yet),
  refilled since. Only an answer to a request sent later than the current base
  re-bases: an old answer that arrives late says less than the one already read.
- **capacity from the reset time**: ``remaining + reset x rate`` is what the provider's
  bucket holds when full: the whole minute's ``limit`` for OpenAI's headers, less where
  the provider enforces a shorter quantum.
- **shared budgets**: the run's actors each have a client and a pacer, and the
  provider's budget is one. Each answer's ``remaining`` already counts every actor's
  requests, but N actors reading the same ``remaining`` would all spend it: each pacer
  therefore takes ``1 / actors`` of the remaining budget, of the capacity and of the
  refill (``share``), so together they spend it once.
- **a refusal pauses the endpoint**: a 429's ``Retry-After`` holds back every request to
  that endpoint until it has passed (the estimate was wrong, or another client spends
  the same budget).
- **headroom**: a request goes out when the estimate covers its cost plus a tenth of
  the bucket (at most what the bucket can spare beside the request). What the estimate
  cannot see (the other actors' requests since their last answer, time in transit) then
  lands in that reserve instead of in a refusal; at steady state the budget still refills
  at its full rate, so the pace is the same.
- **no budget stated, no pacing**: an endpoint that never sent the headers (vLLM,
  SGLang) is not paced at all, and its 429s are left to the retry policy and the
  adaptive limiter.

A request's token cost is estimated as the provider meters it at admission: its prompt
(4 characters a token, 4 tokens a message) plus its output cap (``max_completion_tokens``
or ``max_tokens``) or, without one, the output the endpoint's last answer used.

The pacer is pure (an injected clock, no I/O, no sleeping): ``LLMClient`` asks it how
long to wait, sleeps, and feeds it what came back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from factory.llm.types import RateLimits, Request

__all__ = ["Pacer", "request_tokens"]

_WINDOW_S = 60.0  # the limits are per minute
_MESSAGE_TOKENS = 4  # role and separators, per message


def request_tokens(request: Request, params: Mapping[str, Any], fallback_output: int = 0) -> int:
    """What ``request`` costs against a token budget (see the module docstring):
    prompt characters / 4, 4 a message, plus its output cap, else ``fallback_output``."""
    chars = 0
    for m in request.messages:
        chars += len(m.content)
        for call in m.tool_calls:
            chars += len(call.arguments) + len(call.name)
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description) + 64 * len(tool.parameters)
    cap = params.get("max_completion_tokens") or params.get("max_tokens")
    output = cap if isinstance(cap, int) and cap > 0 else fallback_output
    return (chars + 3) // 4 + _MESSAGE_TOKENS * len(request.messages) + output


@dataclass
class _Bucket:
    """One budget of one endpoint, as this client's share of it."""

    rate: float  # units per second
    capacity: float
    level: float  # may be negative: reserved beyond the budget (debt)
    stamp: float

    def refill(self, now: float) -> None:
        if now > self.stamp:
            if self.level < self.capacity:
                self.level = min(self.capacity, self.level + self.rate * (now - self.stamp))
            self.stamp = now

    def wait_s(self, cost: float, headroom: float) -> float:
        """Seconds until ``cost`` is paid for with ``headroom`` (a share of the capacity)
        left over, if reserved now (0: it fits now)."""
        spare = min(headroom * self.capacity, max(0.0, self.capacity - cost))
        short = cost + spare - self.level
        return short / self.rate if short > 0 else 0.0


@dataclass
class _Endpoint:
    """What the pacer knows of one endpoint's budget."""

    base: float = -float("inf")  # send time of the request whose answer set the level
    buckets: dict[str, _Bucket] = field(default_factory=dict)  # "requests", "tokens"
    # Reservations since the base, by send time: (send time, tokens).
    sent: deque[tuple[float, int]] = field(default_factory=deque)
    sent_tokens: int = 0
    paused_until: float = -float("inf")
    last_output: int = 0  # output tokens of the last answer (cost estimate without a cap)


def _budget(
    limit: int | None, remaining: int | None, reset_s: float | None, share: float
) -> tuple[float, float, float] | None:
    """(rate, capacity, remaining) of one budget, this client's share; None: not stated."""
    if limit is None or remaining is None or limit <= 0:
        return None
    rate = limit / _WINDOW_S
    capacity = float(limit)
    if reset_s is not None:
        capacity = min(capacity, max(float(remaining), remaining + reset_s * rate))
    return rate * share, max(capacity * share, 1e-9), remaining * share


class Pacer:
    """Per-endpoint budget estimates and the wait each request needs to fit them.

    Args:
        actors: how many clients (the run's actors) share each endpoint's budget; each
            pacer plans with ``1 / actors`` of it.
        headroom: share of each bucket kept in reserve (see the module docstring).
        clock: monotonic seconds; the same clock as the send times given to
            :meth:`observe` (tests inject their own).
    """

    def __init__(
        self,
        *,
        actors: int = 1,
        headroom: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.share = 1.0 / max(1, actors)
        self.headroom = headroom
        self._clock = clock
        self._endpoints: dict[str, _Endpoint] = {}
        #: True once some endpoint has stated a budget: until then the client skips the
        #: pacer altogether (one attribute read per request against a vLLM server).
        self.active = False
        self.waited_s = 0.0  # total delay handed out (for stats)
        self.paced = 0  # requests that were told to wait

    def paces(self, endpoint: str) -> bool:
        """Whether ``endpoint`` has stated a budget (its requests are paced)."""
        state = self._endpoints.get(endpoint)
        return state is not None and bool(state.buckets)

    def tokens(self, request: Request, params: Mapping[str, Any], endpoint: str) -> int:
        """``request``'s estimated token cost at ``endpoint`` (``request_tokens``)."""
        state = self._endpoints.get(endpoint)
        return request_tokens(request, params, state.last_output if state else 0)

    # -- what came back ------------------------------------------------------------------
    def observe(
        self, endpoint: str, limits: RateLimits | None, sent_at: float, output_tokens: int = 0
    ) -> None:
        """An answer from ``endpoint`` to a request sent at ``sent_at`` (this clock),
        stating ``limits`` (None: it stated none) and using ``output_tokens``."""
        if limits is None:
            state = self._endpoints.get(endpoint)
            if state is not None:
                state.last_output = output_tokens
            return
        state = self._endpoints.setdefault(endpoint, _Endpoint())
        state.last_output = output_tokens
        if sent_at < state.base:
            return  # an older request's view: the current base is newer
        state.base = sent_at
        while state.sent and state.sent[0][0] <= sent_at:  # the provider had seen these
            state.sent_tokens -= state.sent.popleft()[1]
        ahead = {"requests": len(state.sent), "tokens": state.sent_tokens}
        stated = {
            "requests": _budget(
                limits.requests_limit, limits.requests_remaining, limits.requests_reset_s,
                self.share,
            ),
            "tokens": _budget(
                limits.tokens_limit, limits.tokens_remaining, limits.tokens_reset_s, self.share
            ),
        }  # fmt: skip
        for name, budget in stated.items():
            if budget is None:
                state.buckets.pop(name, None)
                continue
            rate, capacity, remaining = budget
            bucket = _Bucket(rate, capacity, remaining, sent_at)
            bucket.level -= ahead[name]
            state.buckets[name] = bucket
        self.active = self.active or bool(state.buckets)

    def refused(
        self,
        endpoint: str,
        retry_after_s: float | None,
        limits: RateLimits | None = None,
        sent_at: float | None = None,
    ) -> None:
        """``endpoint`` refused a request sent at ``sent_at`` (429), stating ``limits``
        and asking to wait ``retry_after_s``: re-base on the budget it stated (the
        first refusal may come before any answer), and hold back its requests until the
        wait has passed (an endpoint that never stated a budget is not paced)."""
        if limits is not None and sent_at is not None:
            state = self._endpoints.get(endpoint)
            self.observe(endpoint, limits, sent_at, state.last_output if state else 0)
        state = self._endpoints.get(endpoint)
        if state is None or not state.buckets or retry_after_s is None:
            return
        state.paused_until = max(state.paused_until, self._clock() + retry_after_s)

    # -- what goes out -------------------------------------------------------------------
    def reserve(self, endpoints: Sequence[str], tokens: int) -> tuple[str | None, float]:
        """Reserve one request of ``tokens`` at whichever of ``endpoints`` (in the
        caller's order of preference) takes it soonest.

        Returns:
            (the endpoint, seconds to wait before sending); the endpoint is None when
            none of them states a budget (send as usual: no pacing).
        """
        now = self._clock()
        best: tuple[str, _Endpoint] | None = None
        best_wait = float("inf")
        for name in endpoints:
            state = self._endpoints.get(name)
            if state is None or not state.buckets:
                return name, 0.0  # an unpaced endpoint takes it now
            wait = self._wait(state, tokens, now)
            if wait < best_wait:
                best, best_wait = (name, state), wait
                if wait == 0:
                    break  # the first in the caller's order that takes it now
        if best is None:
            return None, 0.0
        name, state = best
        for bucket_name, bucket in state.buckets.items():
            bucket.level -= 1 if bucket_name == "requests" else tokens
        state.sent.append((now + best_wait, tokens))
        state.sent_tokens += tokens
        if best_wait > 0:
            self.paced += 1
            self.waited_s += best_wait
        return name, best_wait

    def may_send_now(self, endpoint: str, tokens: int) -> bool:
        """Reserve a request at ``endpoint`` only if it fits now (a hedge: a spare copy
        that should not wait, nor push the queued requests back); True: reserved."""
        state = self._endpoints.get(endpoint)
        if state is None or not state.buckets:
            return True
        now = self._clock()
        if self._wait(state, tokens, now) > 0:
            return False
        for bucket_name, bucket in state.buckets.items():
            bucket.level -= 1 if bucket_name == "requests" else tokens
        state.sent.append((now, tokens))
        state.sent_tokens += tokens
        return True

    def _wait(self, state: _Endpoint, tokens: int, now: float) -> float:
        wait = max(0.0, state.paused_until - now)
        for name, bucket in state.buckets.items():
            bucket.refill(now)
            wait = max(wait, bucket.wait_s(1 if name == "requests" else tokens, self.headroom))
        return wait
