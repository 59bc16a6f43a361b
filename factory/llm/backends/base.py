"""The LLM backend protocol: many requests in, one result per request out.

Why a protocol: the stages used to call ``LLMClient.complete`` themselves, so a
new way of calling (OpenAI's Batch API, a vLLM pool on Ray, an in-process
engine) meant editing the stages. Now a stage renders requests, hands them to
its :class:`Backend`, and records what comes back (issue 9, point 3); only the
backend knows how a request travels.

The one method the engine calls is :meth:`Backend.run`: an async iterator over
one :class:`LLMResult` per :class:`LLMRequest`, in whatever order they finish.
Requests and completions are the wire-neutral types of ``factory.llm.types``: a
backend maps them to and from its provider's wire format, in its own module, and is
the only code that makes a ``Completion`` or a ``Usage`` from a provider's answer
(issue 34, point 5). A result carries a ``Completion`` (text, usage, cost, attempts,
retries by reason) or a typed failure (an ``LLMError`` after the backend's own retries);
a bug in the backend propagates as itself. ``batched`` says how the engine
should feed it:

- online backends (``batched = False``; HTTP servers answering one request at a
  time) get each request as soon as its row is rendered and admitted, so the
  engine's concurrency slots and budget checks apply per request, right before
  it goes on the wire. :class:`OnlineBackend` turns a per-request
  ``complete`` into ``run``.
- batched backends (``batched = True``; a batch API, an in-process engine)
  get every request the actor has waiting in one ``run`` call
  (``factory.llm.batcher``); a request is admitted (counted against the
  budget) when it is submitted, and its result is stored as it is read.

A backend module supplies a :class:`BackendPlugin`: its name, its config model
(validated from ``llm.backend_options``) and a ``build`` function; the registry
(``factory.llm.backends``) finds it by the recipe's ``llm.backend``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from factory.errors import LLMError
from factory.llm.types import Completion, Request

if TYPE_CHECKING:
    from factory.llm.pricing import Price
    from factory.recipe import LLMConfig

__all__ = [
    "OPENAI_CACHE",
    "Backend",
    "BackendOptions",
    "BackendPlugin",
    "BackendSetup",
    "BatchJournal",
    "CacheTerms",
    "LLMRequest",
    "LLMResult",
    "OnlineBackend",
]


#: The request a backend makes (the neutral ``factory.llm.types.Request``).
LLMRequest = Request


@dataclass(frozen=True)
class LLMResult:
    """The outcome of one request: exactly one of ``completion`` and ``error`` is set."""

    request_id: str
    completion: Completion | None = None
    error: LLMError | None = None

    def __post_init__(self) -> None:
        if (self.completion is None) == (self.error is None):
            raise ValueError("an LLMResult holds a completion or an error, not both or neither")


class BackendOptions(BaseModel):
    """Base of a backend's config model (``llm.backend_options``): strict, like the recipe."""

    model_config = ConfigDict(extra="forbid")


class BatchJournal(Protocol):
    """Where a batched backend keeps the batches it submitted, so that a restarted run
    re-attaches to them (``factory.io.runstate.BatchJournal`` writes them to the output
    folder). An entry is a JSON-able mapping with a unique ``key``."""

    def load(self) -> list[dict[str, Any]]:
        """Every entry saved so far (by this run or an earlier one)."""
        ...

    def save(self, entry: Mapping[str, Any]) -> None:
        """Write ``entry`` (a new one, or a newer state of the one with its ``key``)."""
        ...


@dataclass(frozen=True)
class BackendSetup:
    """What the engine gives a backend's ``build``, once per actor.

    Attributes:
        llm: the recipe's ``llm`` section (endpoints, sampling, retry, deadlines).
        model: the model this backend serves (the judge may use another than ``llm.model``).
        options: ``llm.backend_options``, validated by the backend's config model.
        concurrency: requests this actor may have in flight.
        price: the model's price, ``None`` when unpriced (priced at 0).
        sleep: what to await for backoff (stops retrying once the run's driver is gone).
        before_send: called before a request the engine did not admit itself goes out (a
            hedge); raises when none may (the run's driver is gone).
        batch_journal: the run's record of submitted batches (batched backends), or
            None (nothing to resume: the backend keeps it in memory).
        run_dir: the run's output folder, or None (no run: ``factory evaluate``, tests);
            a backend whose actors share one thing (``ray_data``'s gateway) names it
            after this.
        actors: how many actors build this backend at once and so share a provider's
            rate-limit budget (``factory.llm.pacer`` paces each to its share).
    """

    llm: LLMConfig
    model: str
    options: BackendOptions
    concurrency: int
    price: Price | None
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep
    before_send: Callable[[], None] | None = None
    batch_journal: BatchJournal | None = None
    run_dir: str | None = None
    actors: int = 1


class Backend(ABC):
    """How requests reach a model. Build one per actor, use it from that actor's loop."""

    #: True: the engine hands over every waiting request in one ``run`` (batch APIs).
    batched: ClassVar[bool] = False
    model: str

    @abstractmethod
    def run(self, requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
        """Make ``requests``; yield one result per request as each finishes.

        Raises:
            Exception: only for bugs; an LLM failure is an ``LLMResult.error``.
        """

    def totals(self) -> Mapping[str, float]:
        """Running counts (calls, failed, attempts, tokens, cost) for stats; may be empty."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a fake holds nothing
        """Release connections and sessions (on the loop that opened them)."""

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class OnlineBackend(Backend):
    """A backend that answers one request at a time; ``run`` makes them concurrently."""

    @abstractmethod
    async def complete(self, request: Request) -> Completion:
        """One request, retried as the backend sees fit.

        Raises:
            LLMError: the request failed (``.attempts`` and ``.retries`` say how).
        """

    async def run(self, requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
        async def one(request: LLMRequest) -> LLMResult:
            try:
                c = await self.complete(request)
            except LLMError as exc:
                return LLMResult(request.request_id, error=exc)
            return LLMResult(request.request_id, completion=c)

        if len(requests) == 1:  # the engine's usual call: no task to spawn
            yield await one(requests[0])
            return
        tasks = [asyncio.ensure_future(one(r)) for r in requests]
        try:
            for done in asyncio.as_completed(tasks):
                yield await done
        finally:
            for task in tasks:
                task.cancel()


@dataclass(frozen=True)
class CacheTerms:
    """How a provider caches the static prefix of a prompt, as its docs state: what the
    plan's cost estimate assumes (issue 35, point 4). Prices are the price table's; these
    are the rules that decide which tokens get them.

    Attributes:
        min_tokens: the shortest prefix the provider caches (shorter: no cache at all).
        ttl_s: how long an unused prefix stays cached (a run's first call, and a call after
            a pause this long, writes it again).
        marked: the prefix is cached only where the request marks it (Anthropic's
            ``cache_control``); False: automatically (OpenAI, Gemini's implicit cache).
        explicit_cache: the backend can hold the prefix in an explicit context cache
            (Gemini's ``cachedContents``), billed per token-hour of storage.
    """

    min_tokens: int = 1024
    ttl_s: float = 300.0
    marked: bool = False
    explicit_cache: bool = False


# OpenAI's automatic prompt caching: prefixes of 1,024 tokens and more, kept 5-10 minutes
# of inactivity (https://platform.openai.com/docs/guides/prompt-caching).
OPENAI_CACHE = CacheTerms(min_tokens=1024, ttl_s=300.0)


@dataclass(frozen=True)
class BackendPlugin:
    """A backend as the registry knows it (what a backend module exports as ``plugin``).

    Attributes:
        name: the ``llm.backend`` value that selects it.
        options: its config model; ``llm.backend_options`` is validated against it.
        build: makes the backend for one actor and model.
        batched: its backends take batches (priced at the Batch tier, given a journal).
        cache: how its provider caches a prompt's static prefix; ``None``: no provider
            cache the run pays less for (a local server's prefix cache is free anyway).
    """

    name: str
    options: type[BackendOptions]
    build: Callable[[BackendSetup], Backend]
    batched: bool = False
    cache: CacheTerms | None = None
