"""What the two HTTP backends share: an ``LLMClient`` over the recipe's endpoint pool.

The ``aiohttp`` and ``openai`` backends differ only in the transport that carries
a request (``LLMClient``'s ``client_factory``); routing, circuit breakers,
retries, deadlines and the adaptive limiter are the client's, the same for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.llm.backends.base import BackendSetup, OnlineBackend
from factory.llm.client import ClientFactory, LLMClient
from factory.llm.deadline import AttemptDeadline
from factory.llm.pool import Endpoint, EndpointPool
from factory.llm.retry import RetryPolicy
from factory.llm.types import Completion, Request

__all__ = ["DEFAULT_HEDGE_SHARE", "ClientBackend", "build_llm_client", "recipe_endpoints"]

DEFAULT_HEDGE_SHARE = 0.02  # llm.deadline.hedge_share when every endpoint is on this machine


def recipe_endpoints(setup: BackendSetup, default: Endpoint | None = None) -> list[Endpoint]:
    """The endpoints the recipe names; ``default`` (a provider's own API and key variable)
    where the recipe names none: ``llm.endpoints`` defaults to OpenAI's API, which is not
    where a recipe that says ``llm.backend: anthropic`` and nothing else means to go."""
    llm = setup.llm
    if default is not None and "endpoints" not in llm.model_fields_set:
        return [default]
    return [
        Endpoint(base_url=e.base_url, api_key_env=e.api_key_env, weight=e.weight)
        for e in llm.endpoints
    ]


def build_llm_client(
    setup: BackendSetup,
    client_factory: ClientFactory,
    endpoints: list[Endpoint] | None = None,
) -> LLMClient:
    """An ``LLMClient`` for ``setup.model`` over the recipe's endpoints (one per actor), or
    over ``endpoints`` (a backend whose requests reach no URL, or a provider's own API
    where the recipe names none: :func:`recipe_endpoints`).

    Raises:
        ConfigError: bad sampling options, a missing key (naming its variable) ...
    """
    llm = setup.llm
    pool = EndpointPool(endpoints or recipe_endpoints(setup))
    hedge_share = llm.deadline.hedge_share
    if hedge_share is None:  # hedge where a cancelled request costs nothing
        hedge_share = DEFAULT_HEDGE_SHARE if all(e.is_local for e in pool.endpoints) else 0.0
    deadline = AttemptDeadline(
        llm.timeout_s,
        floor_s=llm.deadline.floor_s,
        p99_factor=llm.deadline.p99_factor,
        min_samples=llm.deadline.min_samples,
        window=llm.deadline.window,
        adaptive=llm.deadline.adaptive,
        hedge_share=hedge_share,
    )
    retry = RetryPolicy(
        max_attempts=llm.retry.max_attempts,
        base_delay=llm.retry.base_delay_s,
        max_delay=llm.retry.max_delay_s,
    )
    return LLMClient(
        pool,
        setup.model,
        llm.sampling,
        concurrency=setup.concurrency,
        timeout_s=llm.timeout_s,
        retry=retry,
        deadline=deadline,
        request_deadline_s=llm.deadline.request_s,
        price=setup.price,
        client_factory=client_factory,
        sleep=setup.sleep,
        before_send=setup.before_send,
        actors=setup.actors,
    )


class ClientBackend(OnlineBackend):
    """An online backend whose requests go through an ``LLMClient``."""

    def __init__(self, client: LLMClient):
        self.client = client
        self.model = client.model

    async def complete(self, request: Request) -> Completion:
        return await self.client.complete(request)

    def totals(self) -> Mapping[str, float]:
        return self.client.totals()

    def health(self) -> dict[str, dict[str, Any]]:
        """Per endpoint: answers, failures, waiting requests (``EndpointPool.health``)."""
        return self.client.pool.health()

    async def aclose(self) -> None:
        await self.client.aclose()
