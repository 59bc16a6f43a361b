"""Backend ``openai``: the official openai SDK as the transport.

For servers or proxies that only the SDK speaks to correctly; the SDK's own
retries are off (``LLMClient`` retries, with one policy for every backend). Its
transport maps the neutral request to the SDK's arguments and the SDK's answer
to the neutral completion (``openai_wire``), the one place this backend reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import openai

from factory.llm.backends.base import (
    OPENAI_CACHE,
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
)
from factory.llm.backends.online import ClientBackend, build_llm_client
from factory.llm.backends.openai_wire import (
    chat_messages,
    completion_from_openai,
    rate_limits_from_headers,
)
from factory.llm.pool import Endpoint
from factory.llm.types import Completion, Request

__all__ = ["OpenAIOptions", "SDKTransport", "plugin", "sdk_transport"]


class OpenAIOptions(BackendOptions):
    """No options of its own: endpoints, retries and deadlines are the ``llm`` section's."""


class SDKTransport:
    """One endpoint's ``factory.llm.client.Transport`` over ``openai.AsyncOpenAI``.

    The SDK's ``with_raw_response`` gives the answer's headers (the provider's
    rate-limit budget, ``RateLimits``) with the same parse the plain call does (the SDK
    builds its raw-response object either way: one more header sent, no extra decode).

    Args:
        sdk: the SDK client (tests pass a stand-in with ``chat.completions.create``,
            answering a mapping or a model without headers).
    """

    def __init__(self, endpoint: Endpoint, sdk: Any):
        self.sdk = sdk
        self.endpoint = endpoint.name
        completions = sdk.chat.completions
        self._create = getattr(completions, "with_raw_response", completions).create

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        response = await self._create(
            model=model,
            messages=chat_messages(request.messages),
            **params,
            extra_headers={"X-Client-Request-Id": request_header},
        )
        headers = getattr(response, "headers", None)  # the raw response's; a stand-in: none
        if headers is not None:
            response = response.parse()
        body = response if isinstance(response, Mapping) else response.model_dump()
        completion = completion_from_openai(body, self.endpoint, model)
        limits = rate_limits_from_headers(headers) if headers is not None else None
        return completion if limits is None else replace(completion, rate_limits=limits)

    async def close(self) -> None:
        close = getattr(self.sdk, "close", None)
        if close is not None:
            await close()


def sdk_transport(endpoint: Endpoint, api_key: str, timeout_s: float) -> SDKTransport:
    """``LLMClient``'s client factory for the SDK: ``AsyncOpenAI`` with SDK retries off."""
    sdk = openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key=api_key, timeout=timeout_s, max_retries=0
    )
    return SDKTransport(endpoint, sdk)


def build(setup: BackendSetup) -> Backend:
    return ClientBackend(build_llm_client(setup, sdk_transport))


plugin = BackendPlugin("openai", OpenAIOptions, build, cache=OPENAI_CACHE)
