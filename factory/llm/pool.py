"""Routing requests over several OpenAI-compatible endpoints, with circuit breakers.

A pool of vLLM / SGLang servers (or one provider URL) is shared by every
request of one ``LLMClient``. Routing is least-outstanding-requests (in-flight
count divided by the endpoint's weight, ties broken round-robin): it adapts to
servers of different speed without measuring them, which matters for LLM
serving where one long generation can occupy a server for minutes.

Each endpoint has a circuit breaker. ``failure_threshold`` consecutive endpoint
failures (connection errors, 5xx, timeouts) open it: no traffic for a cooldown.
Then it is half-open: exactly one probe request is let through; success closes the
breaker, failure opens it again for twice the cooldown. The cooldown starts at
``min_cooldown_s`` and doubles per failed probe up to ``cooldown_s`` (as Envoy's
outlier ejection grows with repeated ejections), and a close resets it. Why: with one
endpoint (a provider URL) every waiting request waits for the breaker, and a burst of
five timeouts in the thin tail of a round is weather, not an outage: a fixed 30 s
cooldown held the last rows of each round of the fault-storm benchmark for 31 s
(2026-11-22), while a dead endpoint still gets probed only a few times a minute. A
result that arrives from a lease taken in an earlier breaker period is counted in the
stats but not used as a verdict on the endpoint's current health.

Pure bookkeeping: no I/O, no awaiting, the clock injected. Everything runs on
one event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from factory.errors import ConfigError, LLMServerError, LLMTimeout, short
from factory.secrets import is_local_url

__all__ = [
    "CircuitState",
    "Endpoint",
    "EndpointPool",
    "EndpointStats",
    "Lease",
    "is_endpoint_failure",
]


class CircuitState(str, enum.Enum):
    """Breaker state of one endpoint."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible server.

    Attributes:
        base_url: URL ending in ``/v1`` (``http://10.0.0.5:8000/v1``).
        api_key_env: environment variable holding *this* endpoint's key; ``None``
            means the server needs no key (a placeholder is sent).
        weight: relative capacity (e.g. number of GPUs / replicas behind it).
        name: label for stats and errors; defaults to ``base_url``.
    """

    base_url: str
    api_key_env: str | None = None
    weight: int = 1
    name: str = ""

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"expected an http(s) URL, got {short(self.base_url, 80)}",
                key_path="llm.endpoints.base_url",
            )
        if parts.username or parts.password:
            # Credentials in a URL end up in logs and manifests; keys go in env vars.
            raise ConfigError(
                "credentials must not be part of the URL; put the key in an environment "
                "variable and name it in api_key_env",
                key_path="llm.endpoints.base_url",
            )
        if self.weight < 1:
            raise ConfigError(
                f"must be at least 1, got {self.weight}", key_path="llm.endpoints.weight"
            )
        if not self.name:
            object.__setattr__(self, "name", self.base_url.rstrip("/"))

    @property
    def is_local(self) -> bool:
        """True for 127.0.0.1 / localhost, where a placeholder key is fine."""
        return is_local_url(self.base_url)


@dataclass(frozen=True)
class Lease:
    """A claim on one endpoint for one request; hand it back to ``release``."""

    endpoint: Endpoint
    started_at: float
    probe: bool
    generation: int


@dataclass(frozen=True)
class EndpointStats:
    """Counters for one endpoint, as reported to the run manifest."""

    name: str
    state: CircuitState
    requests: int
    failures: int
    in_flight: int
    consecutive_failures: int
    times_opened: int
    mean_latency_s: float | None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (state as its string value)."""
        return {
            "name": self.name,
            "state": self.state.value,
            "requests": self.requests,
            "failures": self.failures,
            "in_flight": self.in_flight,
            "consecutive_failures": self.consecutive_failures,
            "times_opened": self.times_opened,
            "mean_latency_s": self.mean_latency_s,
        }


@dataclass
class _Health:
    endpoint: Endpoint
    state: CircuitState = CircuitState.CLOSED
    generation: int = 0
    opened_at: float = 0.0
    cooldown: float = 0.0  # of the current (or last) opening; doubles per failed probe
    probe_in_flight: bool = False
    consecutive_failures: int = 0
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    times_opened: int = 0
    latency_total: float = 0.0
    latency_count: int = 0
    answers: int = 0  # leases released with the endpoint answering
    last_answer: float | None = None  # clock of the latest answer
    last_error: str | None = None  # the latest endpoint failure, one line
    started: dict[int, float] = field(default_factory=dict)  # in flight: lease id -> start


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]


def is_endpoint_failure(exc: BaseException) -> bool:
    """Whether an error says the endpoint is unhealthy (counts toward its breaker).

    Connection errors, 5xx and timeouts do; a 429 (the server is up, just busy)
    and a 4xx (our request is wrong) do not.
    """
    return isinstance(exc, LLMServerError | LLMTimeout)


class EndpointPool:
    """Least-outstanding-requests routing over endpoints with per-endpoint breakers.

    Args:
        endpoints: at least one endpoint; names must be unique.
        failure_threshold: consecutive failures that open a breaker.
        cooldown_s: the longest an open breaker waits before letting one probe through.
        min_cooldown_s: the first wait after a breaker opens (default: 1 s, or
            ``cooldown_s`` when that is shorter); doubled per failed probe.
        clock: monotonic seconds (tests inject a fake).

    Raises:
        ConfigError: no endpoints, duplicate names, or a non-positive threshold/cooldown.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        failure_threshold: int = 5,
        cooldown_s: float = 30.0,
        min_cooldown_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not endpoints:
            raise ConfigError("at least one endpoint is needed", key_path="llm.endpoints")
        names = [e.name for e in endpoints]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(
                f"endpoint {short(dupes[0], 80)} is listed twice", key_path="llm.endpoints"
            )
        if failure_threshold < 1:
            raise ConfigError("failure_threshold must be at least 1", key_path="llm.endpoints")
        if cooldown_s <= 0:
            raise ConfigError("cooldown_s must be positive", key_path="llm.endpoints")
        if min_cooldown_s is not None and not 0 < min_cooldown_s <= cooldown_s:
            raise ConfigError(
                "min_cooldown_s must be positive and at most cooldown_s", key_path="llm.endpoints"
            )
        self._health = [_Health(endpoint=e) for e in endpoints]
        self._by_name = {h.endpoint.name: h for h in self._health}
        self._threshold = failure_threshold
        self._cooldown = cooldown_s
        self._min_cooldown = min(1.0, cooldown_s) if min_cooldown_s is None else min_cooldown_s
        self._clock = clock
        self._cursor = 0

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """The endpoints in configuration order."""
        return tuple(h.endpoint for h in self._health)

    def state(self, name: str) -> CircuitState:
        """Current breaker state of the endpoint called ``name`` (cooldown applied)."""
        health = self._by_name[name]
        self._refresh(health)
        return health.state

    def _refresh(self, health: _Health) -> None:
        opened_for = self._clock() - health.opened_at
        if health.state is CircuitState.OPEN and opened_for >= health.cooldown:
            health.state = CircuitState.HALF_OPEN
            health.generation += 1

    def _selectable(self, health: _Health) -> bool:
        self._refresh(health)
        if health.state is CircuitState.CLOSED:
            return True
        return health.state is CircuitState.HALF_OPEN and not health.probe_in_flight

    def wait_s(self) -> float:
        """Seconds until some endpoint may take a request: 0 when one can now.

        Why: an open breaker means "back off", not "give up". ``LLMClient`` waits this
        long (and asks again) instead of failing the request, so a single endpoint
        whose breaker opened under a burst of timeouts delays its requests by the
        cooldown rather than turning them into dead letters that were never sent. While
        a half-open probe is out, the answer is a short poll interval.
        """
        if any(self._selectable(h) for h in self._health):
            return 0.0
        now = self._clock()
        waits = [
            h.cooldown - (now - h.opened_at) for h in self._health if h.state is CircuitState.OPEN
        ]
        if any(h.state is CircuitState.HALF_OPEN for h in self._health):
            waits.append(min(1.0, self._min_cooldown / 2))  # poll until the probe answers
        return max(0.01, min(waits, default=1.0))

    def candidates(self, *, avoid: Collection[str] = ()) -> list[str]:
        """The endpoints :meth:`acquire` may pick now, in its order of preference (not
        in ``avoid``, then least loaded): the client's pacer picks the first whose
        rate-limit budget takes the request soonest."""
        n = len(self._health)
        usable = [i for i, h in enumerate(self._health) if self._selectable(h)]
        order = sorted(
            usable,
            key=lambda i: (
                self._health[i].endpoint.name in avoid,
                self._health[i].in_flight / self._health[i].endpoint.weight,
                (i - self._cursor) % n,
            ),
        )
        return [self._health[i].endpoint.name for i in order]

    def acquire(self, *, avoid: Collection[str] = (), prefer: str | None = None) -> Lease:
        """Pick an endpoint for one request and count it as in flight.

        Args:
            avoid: names of endpoints that already failed this request; used only
                when a healthy alternative exists (failover, not exclusion).
            prefer: the endpoint to take when it is selectable and not avoided (the
                one the client's pacer reserved the request's budget at).

        Returns:
            A lease; ``lease.probe`` is set when it is a half-open breaker's probe.

        Raises:
            LLMServerError: every breaker is open (or half-open with its probe
                already out); retryable, so the caller backs off and tries again.
        """
        usable = [i for i, h in enumerate(self._health) if self._selectable(h)]
        if not usable:
            raise LLMServerError(self.unavailable_message())
        preferred = [i for i in usable if self._health[i].endpoint.name not in avoid]
        chosen = next((i for i in preferred if self._health[i].endpoint.name == prefer), None)
        if chosen is None:
            chosen = self._least_loaded(preferred or usable)
        else:
            self._cursor = (chosen + 1) % len(self._health)
        health = self._health[chosen]
        probe = health.state is CircuitState.HALF_OPEN
        if probe:
            health.probe_in_flight = True
        health.in_flight += 1
        health.requests += 1
        lease = Lease(health.endpoint, self._clock(), probe, health.generation)
        health.started[id(lease)] = lease.started_at
        return lease

    def _least_loaded(self, indices: list[int]) -> int:
        n = len(self._health)
        # Walk from the round-robin cursor so equal loads take turns.
        order = sorted(indices, key=lambda i: (i - self._cursor) % n)
        best = min(order, key=lambda i: self._health[i].in_flight / self._health[i].endpoint.weight)
        self._cursor = (best + 1) % n
        return best

    def unavailable_message(self) -> str:
        now = self._clock()
        waits = [
            h.cooldown - (now - h.opened_at) for h in self._health if h.state is CircuitState.OPEN
        ]
        hint = f"; next probe in {max(0.0, min(waits)):.1f}s" if waits else "; a probe is running"
        return f"no endpoint available: all {len(self._health)} circuit breakers are open{hint}"

    def release(
        self,
        lease: Lease,
        ok: bool | None,
        latency_s: float | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        """Return a lease with its outcome.

        Args:
            lease: from ``acquire``; release each lease exactly once.
            ok: ``True`` the endpoint answered (even with a 4xx/429), ``False`` an
                endpoint failure (``is_endpoint_failure``), ``None`` no verdict
                (the request was cancelled): only the counters change.
            latency_s: request latency; default: measured from ``acquire``.
            error: what failed, kept (one line) as the endpoint's last error.
        """
        health = self._by_name[lease.endpoint.name]
        health.in_flight = max(0, health.in_flight - 1)
        health.started.pop(id(lease), None)
        if ok:
            health.answers += 1
            health.last_answer = self._clock()
        latency = self._clock() - lease.started_at if latency_s is None else latency_s
        health.latency_total += latency
        health.latency_count += 1
        if ok is False:
            health.failures += 1
            if error is not None:
                health.last_error = _one_line(error)
        if lease.probe:
            health.probe_in_flight = False
        if ok is None or lease.generation != health.generation:
            return  # cancelled, or a verdict on an earlier breaker period
        if lease.probe:
            if ok:
                self._close(health)
            else:
                self._open(health)
        elif health.state is CircuitState.CLOSED:
            if ok:
                health.consecutive_failures = 0
            else:
                health.consecutive_failures += 1
                if health.consecutive_failures >= self._threshold:
                    self._open(health)

    def _open(self, health: _Health) -> None:
        # A failed probe (the breaker was half-open) doubles the wait; a fresh opening
        # from closed starts again at the shortest one.
        reopened = health.state is CircuitState.HALF_OPEN
        health.cooldown = (
            min(self._cooldown, 2 * health.cooldown) if reopened else self._min_cooldown
        )
        health.state = CircuitState.OPEN
        health.opened_at = self._clock()
        health.generation += 1
        health.times_opened += 1

    def _close(self, health: _Health) -> None:
        health.state = CircuitState.CLOSED
        health.consecutive_failures = 0
        health.generation += 1

    @asynccontextmanager
    async def session(self, *, avoid: Collection[str] = ()) -> AsyncIterator[Lease]:
        """``async with pool.session() as lease:`` acquires and releases around a request.

        The verdict comes from how the block exits: normally -> ok; with an
        endpoint failure -> failure; cancelled -> no verdict; any other error -> ok
        (the endpoint answered; the error is ours or the request's).
        """
        lease = self.acquire(avoid=avoid)
        try:
            yield lease
        except asyncio.CancelledError:
            self.release(lease, None)
            raise
        except BaseException as exc:
            self.release(lease, not is_endpoint_failure(exc), error=exc)
            raise
        else:
            self.release(lease, True)

    def health(self) -> dict[str, dict[str, Any]]:
        """What the driver watches per endpoint (``factory.engine.health``): answers,
        failures, requests in flight and how long the oldest has waited, seconds since
        the last answer, the last failure."""
        now = self._clock()
        return {
            h.endpoint.name: {
                "answers": h.answers,
                "failures": h.failures,
                "in_flight": h.in_flight,
                "oldest_s": round(now - min(h.started.values()), 3) if h.started else 0.0,
                "since_answer_s": None if h.last_answer is None else round(now - h.last_answer, 3),
                "last_error": h.last_error,
            }
            for h in self._health
        }

    def stats(self) -> dict[str, EndpointStats]:
        """Per-endpoint counters keyed by endpoint name."""
        out: dict[str, EndpointStats] = {}
        for h in self._health:
            self._refresh(h)
            out[h.endpoint.name] = EndpointStats(
                name=h.endpoint.name,
                state=h.state,
                requests=h.requests,
                failures=h.failures,
                in_flight=h.in_flight,
                consecutive_failures=h.consecutive_failures,
                times_opened=h.times_opened,
                mean_latency_s=(h.latency_total / h.latency_count) if h.latency_count else None,
            )
        return out
