"""The async LLM client: one chat completion with routing, retries, cost and errors.

``LLMClient.complete`` is what a Ray Data actor awaits per row. It bounds the
requests it has in flight with a semaphore, picks an endpoint from the
``EndpointPool`` per attempt (a retry fails over to another healthy endpoint),
retries what is retryable (``retry.call_with_retry``), and returns a
``Completion`` with text, reasoning, usage, cost and provenance.

A :class:`Transport` carries one attempt: one per endpoint, built once through the
``client_factory`` the backend passes (``factory.llm.backends``: the aiohttp one, the
openai SDK's with its own retries off, the Ray Data gateway's), so there is exactly one
retry loop with one policy. A transport sends the neutral ``Request`` in its wire
format and returns the neutral ``Completion`` (``factory.llm.types``): the client never
reads a wire shape; it prices the ``Usage`` and counts attempts. A transport's
exceptions are translated into ``factory.errors`` at this boundary by the one error map
(``factory.llm.errormap``), chained with ``from``; messages carry neither the key nor
the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from factory.core.trajectory import IdentityMemo
from factory.errors import (
    ConfigError,
    LLMError,
    LLMRateLimited,
    LLMStopped,
    LLMTimeout,
    LLMUnavailable,
)
from factory.llm.deadline import AttemptDeadline
from factory.llm.errormap import translate_error
from factory.llm.limiter import AdaptiveLimiter
from factory.llm.pacer import Pacer
from factory.llm.params import RequestParams, resolve_params
from factory.llm.pool import Endpoint, EndpointPool, is_endpoint_failure
from factory.llm.pricing import Price, cost
from factory.llm.retry import RetryPolicy, call_with_retry, must_wait
from factory.llm.types import Completion, Request
from factory.secrets import PLACEHOLDER_KEY, api_key_from_env

HEDGE_RECHECK_S = 0.25  # how often an attempt past due for a hedge looks for a spare slot

__all__ = [
    "ClientFactory",
    "Completion",
    "LLMClient",
    "Transport",
    "resolve_api_key",
    "translate_error",
]

log = logging.getLogger(__name__)


class Transport(Protocol):
    """One endpoint's wire, as ``LLMClient`` uses it (a backend supplies it)."""

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        """One attempt of ``request`` to ``model`` with sampling ``params`` (the family's
        mapping of the recipe's options), ``request_header`` as ``X-Client-Request-Id``.

        Returns:
            The answer with its ``endpoint`` set; cost, attempts, latency and retries are
            filled in by the client.

        Raises:
            Exception: a transport failure, translated by ``factory.llm.errormap``.
        """
        ...

    async def close(self) -> None:
        """Close its connections (on the loop that opened them)."""
        ...


# (endpoint, api key, timeout seconds) -> the endpoint's transport.
ClientFactory = Callable[[Endpoint, str, float], Transport]

# Hosts that always need a key, so a missing api_key_env is a recipe error
# rather than a 401 on the first request.
_KEYED_HOSTS = ("api.openai.com",)

_MAX_REQUEST_ID = 512  # OpenAI's limit for X-Client-Request-Id


def resolve_api_key(endpoint: Endpoint) -> str:
    """The key to send to ``endpoint``: its own env variable, or a placeholder.

    A local endpoint may run without a key (vLLM without ``--api-key``) and then
    gets ``PLACEHOLDER_KEY``. The key is always passed explicitly, so the SDK
    never falls back to ``OPENAI_API_KEY`` on its own and hands it to a server
    it does not belong to.

    Raises:
        ConfigError: a remote endpoint's variable is unset, or a provider that
            always needs a key has no ``api_key_env``. The message names the
            variable to set.
    """
    var = endpoint.api_key_env
    if var is None:
        host = endpoint.base_url.split("://", 1)[-1].split("/", 1)[0].lower()
        if host in _KEYED_HOSTS:
            raise ConfigError(
                f"endpoint {endpoint.name} needs an API key: set api_key_env to the name of "
                "an environment variable (usually OPENAI_API_KEY) and export it",
                key_path="llm.endpoints.api_key_env",
            )
        return PLACEHOLDER_KEY
    key = api_key_from_env(var)
    if key is not None:
        return key
    if endpoint.is_local:
        return PLACEHOLDER_KEY
    raise ConfigError(
        f"no API key for endpoint {endpoint.name}: the environment variable {var} is not "
        f"set; run `export {var}=...` before starting the pipeline",
        key_path="llm.endpoints.api_key_env",
    )


def _check_key_isolation(endpoints: tuple[Endpoint, ...]) -> None:
    """Refuse configurations that would send a provider's key to a local server."""
    remote_vars = {e.api_key_env for e in endpoints if e.api_key_env and not e.is_local}
    for e in endpoints:
        if e.is_local and e.api_key_env in remote_vars:
            raise ConfigError(
                f"local endpoint {e.name} would be sent the key in {e.api_key_env}, which "
                "belongs to a remote endpoint; give it its own variable or none",
                key_path="llm.endpoints.api_key_env",
            )


def _answered(task: asyncio.Future[Any]) -> bool:
    """Done with an answer (not cancelled, not failed)."""
    return task.done() and not task.cancelled() and task.exception() is None


def _request_header(request_id: str) -> str:
    printable = "".join(ch if 32 <= ord(ch) < 127 else "_" for ch in request_id)
    return printable[:_MAX_REQUEST_ID]


class LLMClient:
    """Chat completions against an endpoint pool, for one model and sampling setup.

    Build one per actor (it owns HTTP connection pools) and use it from that
    actor's event loop only.

    Args:
        pool: the endpoints; shared breaker and routing state for this client.
        model: model id sent to the server.
        sampling: the recipe's ``llm.sampling``; mapped per model family.
        concurrency: requests this client has in flight at most.
        timeout_s: bound on one attempt, end to end (the ceiling of ``deadline``).
        retry: retry policy for retryable failures.
        deadline: the per-attempt deadline policy (default: ``timeout_s`` for every
            attempt); a hung attempt is cancelled at its deadline and retried.
        request_deadline_s: bound on the whole request (attempts, backoff, waiting for
            an open breaker); ``None``: no bound beyond the attempts.
        price: for ``cost_usd``; ``None`` prices the model at 0 (local models).
        client_factory: builds the transport per endpoint (the backend's; tests pass
            their own); an SDK's own retries must be off.
        sleep: awaited for backoff delays (tests inject a recorder).
        before_send: called before each attempt (once it holds its slot) and each hedge
            goes out; raises when none may (the engine passes its driver watch: no
            request once the driver is gone).
        rng: jitter source.
        clock: monotonic seconds for latency (and the pacer's estimate).
        actors: how many clients (the run's actors) share the endpoints' rate-limit
            budgets: each paces itself to its share (``factory.llm.pacer``).
        pace: pace requests by the budget an endpoint states in its answers' headers
            (``factory.llm.pacer``); False: only retries and the adaptive limiter.

    Raises:
        ConfigError: bad sampling options, bad concurrency/timeout, a missing key
            (naming the variable), or a key shared between a remote and a local
            endpoint.
    """

    def __init__(
        self,
        pool: EndpointPool,
        model: str,
        sampling: Mapping[str, Any],
        *,
        concurrency: int,
        timeout_s: float,
        retry: RetryPolicy,
        price: Price | None,
        deadline: AttemptDeadline | None = None,
        request_deadline_s: float | None = None,
        client_factory: ClientFactory,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        before_send: Callable[[], None] | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        actors: int = 1,
        pace: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(
                f"must be at least 1, got {concurrency}", key_path="llm.per_actor_concurrency"
            )
        if not timeout_s > 0:
            raise ConfigError(f"must be positive, got {timeout_s}", key_path="llm.timeout_s")
        self._request: RequestParams = resolve_params(model, sampling)
        # A request's own sampling (the stage's: one object for all its requests).
        self._params_of: IdentityMemo[Mapping[str, Any], dict[str, Any]] = IdentityMemo(
            lambda options: resolve_params(model, options).params
        )
        self._pool = pool
        self._model = model
        self._timeout_s = timeout_s
        self.deadline = deadline or AttemptDeadline(timeout_s, adaptive=False)
        self._request_deadline_s = request_deadline_s
        self._retry = retry
        self._price = price
        self._sleep = sleep
        self._before_send = before_send
        self._hedges = 0  # hedges sent by this client
        self._sent = 0  # attempts sent by this client, hedges included
        self._releasing: set[asyncio.Future[None]] = set()
        self._rng = rng or random.Random()
        self._clock = clock
        # Adaptive: halves on 429 / timeout / 5xx or queueing latency, grows back on success.
        self.limiter = AdaptiveLimiter(concurrency)
        # Paced by a provider's stated budget: before the slot is taken (see ``_pace``).
        self.pacer = Pacer(actors=actors, clock=clock) if pace else None
        _check_key_isolation(pool.endpoints)
        keys = {e.name: resolve_api_key(e) for e in pool.endpoints}
        self._clients = {e.name: client_factory(e, keys[e.name], timeout_s) for e in pool.endpoints}
        self._totals = {
            "calls": 0,
            "failed": 0,
            "attempts": 0,
            "input_tokens": 0,
            "output_tokens": 0,
            "cost_usd": 0.0,
        }
        self.retries: Counter[str] = Counter()  # retried attempts by reason, this client

    @property
    def model(self) -> str:
        """The model id this client requests."""
        return self._model

    @property
    def pool(self) -> EndpointPool:
        """The endpoint pool (for its stats)."""
        return self._pool

    @property
    def request_params(self) -> RequestParams:
        """Resolved sampling parameters, including the options dropped for this model."""
        return self._request

    def totals(self) -> dict[str, float]:
        """Running counts for this client: calls, failures, attempts, tokens, cost."""
        return dict(self._totals)

    async def complete(self, request: Request) -> Completion:
        """One completion, retried and failed over as needed.

        Args:
            request: what to ask; its ``request_id`` correlates logs, the server's access
                log (``X-Client-Request-Id``) and the row, and becomes ``row_id`` on errors.

        Returns:
            The completion.

        Raises:
            LLMError: after retries (``LLMTimeout``, ``LLMRateLimited``,
                ``LLMServerError``) or at once (``LLMBadRequest``); ``.attempts``
                says how many were made.
        """
        request_id = request.request_id
        started = self._clock()
        give_up_at = started + self._request_deadline_s if self._request_deadline_s else None
        tried: list[str] = []
        sent = 0  # attempts that reached the wire
        retries: Counter[str] = Counter()
        last_error: list[LLMError] = []  # the last attempt's error, for a late give-up
        params = (
            self._request.params if request.sampling is None else self._params_of(request.sampling)
        )
        header = _request_header(request_id)

        async def attempt(_number: int) -> Completion:
            nonlocal sent
            await self._wait_for_endpoint(give_up_at)
            target = None
            if self.pacer is not None and self.pacer.active:
                target = await self._pace(self.pacer, request, params, tried, give_up_at)
            await self.limiter.acquire()
            if target is None and self.pacer is not None and self.pacer.active:
                # The first budget arrived while this request waited for its slot: pace it
                # too (else every request queued for a slot goes out unpaced, into 429s).
                await self.limiter.release()
                target = await self._pace(self.pacer, request, params, tried, give_up_at)
                await self.limiter.acquire()
            if self._before_send is not None:
                # Again here, not only when the row was admitted: waiting for a slot or an
                # endpoint can outlast the driver (its kill -9 on a loaded machine).
                try:
                    self._before_send()
                except BaseException:
                    await self.limiter.release()
                    raise
            loop = asyncio.get_running_loop()
            sent_at = loop.time()
            sent += 1
            self._sent += 1
            hedged = retries["hedge"]
            try:
                completion = await self._attempt(
                    request, params, header, tried, give_up_at, retries, target
                )
            except (LLMRateLimited, LLMTimeout):  # refused or hung: an overload signal
                self.limiter.on_attempt(overloaded=True)
                raise
            except LLMError:
                self.limiter.on_attempt(overloaded=False)
                raise
            finally:
                sent += retries["hedge"] - hedged  # a hedge reached the wire too
                await self.limiter.release()
            latency = loop.time() - sent_at
            self.deadline.observe(latency)
            self.limiter.on_success(latency)
            return completion

        def on_retry(number: int, err: LLMError, delay: float) -> None:
            retries[err.reason] += 1
            last_error[:] = [err]
            # One line per retry would flood the console of a 90k run: DEBUG only; the
            # counts by reason reach the manifest through the rows.
            log.debug(
                "request %s: attempt %d failed (%s); retrying in %.2fs",
                request_id,
                number,
                err.describe(),
                delay,
            )

        try:
            result = await call_with_retry(
                attempt,
                self._retry,
                sleep=self._sleep,
                on_retry=on_retry,
                rng=self._rng,
                give_up_at=give_up_at,
                clock=self._clock,
            )
        except LLMError as caught:
            err = caught
            if isinstance(err, LLMStopped) and sent and last_error:
                err.args = (  # the run cut its retries: unissued, its last failure named
                    f"{err}; {sent} attempt{'s' if sent > 1 else ''} sent, the last: "
                    f"{last_error[0].describe()}",
                )
            elif isinstance(err, LLMUnavailable) and sent and last_error:
                err = last_error[0]  # sent and failed, then no endpoint: the real failure
            self._totals["calls"] += 1
            self._totals["failed"] += 1
            self._totals["attempts"] += sent
            self.retries.update(retries)
            err.attempts = sent  # type: ignore[attr-defined]  # only what reached the wire
            err.retries = dict(retries)  # type: ignore[attr-defined]
            if err.row_id is None:
                err.row_id = request_id
            if err is caught:
                raise
            raise err from caught
        completion = result.value
        self.retries.update(retries)
        self._totals["calls"] += 1
        self._totals["attempts"] += sent
        price = cost(completion.usage, self._price)
        self._totals["input_tokens"] += completion.usage.input
        self._totals["output_tokens"] += completion.usage.output
        self._totals["cost_usd"] += price
        return replace(
            completion,
            cost_usd=price,
            attempts=sent,
            latency_s=self._clock() - started,
            retries=dict(retries),
        )

    async def _wait_for_endpoint(self, give_up_at: float | None) -> None:
        """Back off while every breaker is open, instead of failing an attempt never sent.

        Raises:
            LLMUnavailable: the request's deadline passes before an endpoint would take
                it (``complete`` reports the last real failure instead when an earlier
                attempt was sent).
        """
        while (wait := self._pool.wait_s()) > 0:
            if give_up_at is not None and self._clock() + wait >= give_up_at:
                raise LLMUnavailable(
                    "no endpoint accepted the request before its deadline "
                    f"(llm.deadline.request_s): {self._pool.unavailable_message()}"
                )
            with must_wait(wait):  # an open breaker's cool-down is not cut short
                await self._sleep(wait)

    async def _pace(
        self,
        pacer: Pacer,
        request: Request,
        params: Mapping[str, Any],
        tried: list[str],
        give_up_at: float | None,
    ) -> str | None:
        """Wait until the endpoint that takes this request soonest has budget for it
        (``factory.llm.pacer``); that endpoint, or None when none states a budget.

        Why before the concurrency slot: a request paced for one endpoint must not hold a
        slot a request to another endpoint (or an unpaced one) could use; and the wait
        is planned (reserved in order), so a slot is rarely idle for it.

        Raises:
            LLMUnavailable: the wait would end after the request's deadline.
        """
        names = self._pool.candidates(avoid=tried)
        first = names[0] if names else None
        tokens = pacer.tokens(request, params, first) if first is not None else 0
        name, wait = pacer.reserve(names, tokens)
        if wait > 0:
            if give_up_at is not None and self._clock() + wait >= give_up_at:
                raise LLMUnavailable(
                    f"{name}: its rate-limit budget has no room for the request before its "
                    "deadline (llm.deadline.request_s)"
                )
            with must_wait(wait):  # the provider's budget, like a Retry-After: not cut short
                await self._sleep(wait)
        return name

    async def _attempt(
        self,
        request: Request,
        params: Mapping[str, Any],
        header: str,
        tried: list[str],
        give_up_at: float | None,
        hedges: Counter[str],
        target: str | None = None,
    ) -> Completion:
        lease = self._pool.acquire(avoid=tried, prefer=target)
        name = lease.endpoint.name
        sent = self._clock()
        pacer = self.pacer
        try:
            transport = self._clients[name]
            completion, also_paid = await self._within_deadline(
                lambda: transport.send(request, self._model, params, header),
                name,
                give_up_at,
                hedges,
                (request, params),
            )
            for other in also_paid:  # a hedge whose answer came too: it was paid as well
                completion = replace(completion, usage=completion.usage + other.usage)
        except asyncio.CancelledError:
            self._pool.release(lease, None, self._clock() - sent)
            raise
        except Exception as exc:
            err = translate_error(exc, name)
            if err is None:  # not a transport failure: a bug, surface it as is
                self._pool.release(lease, True, self._clock() - sent)
                raise
            if pacer is not None and isinstance(err, LLMRateLimited):
                pacer.refused(name, err.retry_after, err.rate_limits, sent)
            self._pool.release(lease, not is_endpoint_failure(err), self._clock() - sent, error=err)
            if err.retryable and name not in tried:
                tried.append(name)
            if err is exc:
                raise
            raise err from exc
        self._pool.release(lease, True, self._clock() - sent)
        if pacer is not None and (pacer.active or completion.rate_limits is not None):
            pacer.observe(name, completion.rate_limits, sent, completion.usage.output)
        return completion

    async def _within_deadline(
        self,
        make: Callable[[], Awaitable[Any]],
        endpoint: str,
        give_up_at: float | None,
        hedges: Counter[str],
        asked: tuple[Request, Mapping[str, Any]] | None = None,
    ) -> tuple[Any, list[Any]]:
        """Await one attempt until its deadline, re-read while waiting (the policy may
        tighten once it has seen enough answers); cancel it when the deadline passes.

        Past ``AttemptDeadline.hedge_after_s`` (the observed p95, at least twice the
        median), with spare capacity and hedge budget left, the same request goes out
        once more (counted in ``hedges``);
        the first answer wins and the other is cancelled. Returns the answer and any other
        answer that arrived with it (paid too: its cost is counted). ``asked`` (the
        request and its parameters) prices a hedge against a paced endpoint's budget.
        """
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Any] = asyncio.ensure_future(make())
        tasks = [first]
        started = loop.time()
        try:
            while True:
                now = loop.time()
                limit = self.deadline.timeout_s()
                remaining = started + limit - now
                if give_up_at is not None:
                    remaining = min(remaining, give_up_at - self._clock())
                if remaining <= 0:
                    break
                # Wake at least every second so a deadline that tightened is applied.
                wake = min(remaining, 1.0)
                if len(tasks) == 1:
                    due = self._hedge_due(started, now)
                    hedge = (
                        self._hedge(make, hedges, endpoint, asked)
                        if due is not None and due <= 0
                        else None
                    )
                    if hedge is not None:
                        tasks.append(hedge)
                    elif due is not None:  # due later, or no spare slot yet: look again
                        wake = min(wake, max(due, HEDGE_RECHECK_S))
                running = [t for t in tasks if not t.done()]
                if running:
                    await asyncio.wait(running, timeout=wake, return_when=asyncio.FIRST_COMPLETED)
                answered = [t for t in tasks if _answered(t)]
                if answered:
                    for t in tasks:
                        if not t.done():
                            t.cancel()
                    return answered[0].result(), [t.result() for t in answered[1:]]
                if all(t.done() for t in tasks):
                    return first.result(), []  # raises: every attempt failed (the first's error)
        except BaseException:  # cancelled, or the driver is gone (no hedge may go out)
            for t in tasks:
                t.cancel()
            raise
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        raise LLMTimeout(
            f"{endpoint}: attempt hung past its deadline {self.deadline.describe()}; "
            "cancelled and retried (llm.deadline, llm.timeout_s)",
            endpoint=endpoint,
        )

    def _hedge_due(self, started: float, now: float) -> float | None:
        """Seconds until this attempt may be hedged (<= 0: now), or None: never."""
        after = self.deadline.hedge_after_s()
        if after is None or not self.deadline.may_hedge(self._hedges, self._sent):
            return None
        return started + after - now

    def _hedge(
        self,
        make: Callable[[], Awaitable[Any]],
        hedges: Counter[str],
        endpoint: str = "",
        asked: tuple[Request, Mapping[str, Any]] | None = None,
    ) -> asyncio.Future[Any] | None:
        """The same request once more on a spare slot of the limiter (given back when it
        ends), or None when there is none now (the caller looks again later). At an
        endpoint that states a budget, only when the budget has room now (a hedge is
        never worth a wait or a refusal)."""
        if self._before_send is not None:
            self._before_send()
        if not self.limiter.try_spare():
            return None
        pacer = self.pacer
        if pacer is not None and asked is not None and pacer.paces(endpoint):
            tokens = pacer.tokens(*asked, endpoint)
            if not pacer.may_send_now(endpoint, tokens):
                self._give_back_spare(None)
                return None
        self._hedges += 1
        self._sent += 1
        hedges["hedge"] += 1
        task = asyncio.ensure_future(make())
        task.add_done_callback(self._give_back_spare)
        return task

    def _give_back_spare(self, _: object) -> None:
        release = asyncio.ensure_future(self.limiter.release())
        self._releasing.add(release)  # a task nobody holds may be collected mid-way
        release.add_done_callback(self._releasing.discard)

    async def aclose(self) -> None:
        """Close every endpoint's HTTP client."""
        for transport in self._clients.values():
            await transport.close()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
