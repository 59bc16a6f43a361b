"""Backend ``aiohttp`` (the default): the lean HTTP transport of ``factory.llm.http``.

About 3x less client CPU per call than the openai SDK (BENCHMARKS.md), for any
OpenAI-compatible server (vLLM, SGLang, a provider). Its transport is where this
backend meets the wire: the neutral request becomes a chat-completions body
(``openai_wire.chat_messages``) and the JSON answer a neutral completion
(``openai_wire.completion_from_openai``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

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
from factory.llm.errormap import HTTPStatusFailure
from factory.llm.http import HTTPChatClient
from factory.llm.pool import Endpoint
from factory.llm.types import Completion, Request

__all__ = ["AiohttpOptions", "AiohttpTransport", "aiohttp_transport", "plugin"]


class AiohttpOptions(BackendOptions):
    """No options of its own: endpoints, retries and deadlines are the ``llm`` section's."""


class AiohttpTransport:
    """One endpoint's ``factory.llm.client.Transport`` over ``HTTPChatClient``."""

    def __init__(self, endpoint: Endpoint, api_key: str, timeout_s: float):
        self.http = HTTPChatClient(endpoint, api_key, timeout_s)
        self.endpoint = endpoint.name

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        payload = {"model": model, "messages": chat_messages(request.messages), **params}
        try:
            body, headers = await self.http.post_chat(payload, request_header)
        except HTTPStatusFailure as exc:
            if exc.status == 429:  # a refusal states the budget too: the pacer re-bases
                exc.rate_limits = rate_limits_from_headers(exc.headers)
            raise
        completion = completion_from_openai(body, self.endpoint, model)
        limits = rate_limits_from_headers(headers)
        return completion if limits is None else replace(completion, rate_limits=limits)

    async def close(self) -> None:
        await self.http.close()


def aiohttp_transport(endpoint: Endpoint, api_key: str, timeout_s: float) -> AiohttpTransport:
    """``LLMClient``'s client factory for this transport."""
    return AiohttpTransport(endpoint, api_key, timeout_s)


def build(setup: BackendSetup) -> Backend:
    return ClientBackend(build_llm_client(setup, aiohttp_transport))


plugin = BackendPlugin("aiohttp", AiohttpOptions, build, cache=OPENAI_CACHE)
