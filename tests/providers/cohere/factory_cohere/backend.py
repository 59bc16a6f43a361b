"""Backend ``cohere``: Cohere's v2 Chat API (``POST {base}/chat``), as a plug-in.

Everything a provider needs comes from the factory's public backend API: the neutral
``Request``/``Completion``/``Usage`` (``factory.llm.types``), ``ClientBackend`` and
``build_llm_client`` (one retry loop, deadlines, breakers and the adaptive limiter for
every provider), ``recipe_endpoints`` (the provider's own API where the recipe names
none) and ``status_error`` (what an HTTP status means). This module only maps the wire.

Wire shapes from Cohere's API reference (https://docs.cohere.com/reference/chat, v2):
request ``{model, messages: [{role, content}], max_tokens, temperature, p, seed}``,
response ``{id, finish_reason, message: {role, content: [{type: text, text}]},
usage: {billed_units: {input_tokens, output_tokens}, tokens: {...}}}``, key as
``Authorization: Bearer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from factory.llm.backends.base import Backend, BackendOptions, BackendPlugin, BackendSetup
from factory.llm.backends.online import ClientBackend, build_llm_client, recipe_endpoints
from factory.llm.errormap import status_error
from factory.llm.pool import Endpoint
from factory.llm.types import Completion, Request, Usage

API = "https://api.cohere.com/v2"
KEY_ENV = "CO_API_KEY"

# Cohere's finish reasons in the factory's (OpenAI's) words.
FINISH = {"COMPLETE": "stop", "STOP_SEQUENCE": "stop", "MAX_TOKENS": "length",
          "TOOL_CALL": "tool_calls", "ERROR": "error"}  # fmt: skip
# The factory's sampling keys (already mapped per family) in Cohere's names.
PARAMS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens",
          "temperature": "temperature", "top_p": "p", "seed": "seed"}  # fmt: skip


class CohereOptions(BackendOptions):
    """No options of its own: endpoints, retries and deadlines are the ``llm`` section's."""


def chat_body(request: Request, model: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of ``POST /v2/chat`` (the static system message stays first)."""
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.content}
        for m in request.messages
    ]
    body: dict[str, Any] = {"model": model, "messages": messages}
    for key, value in params.items():
        if key in PARAMS:
            body[PARAMS[key]] = value
    return body


def completion_from_cohere(body: Mapping[str, Any], endpoint: str, model: str) -> Completion:
    """A v2 chat response as a ``Completion`` (the client prices it, counts attempts)."""
    blocks = (body.get("message") or {}).get("content") or []
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    billed = (body.get("usage") or {}).get("billed_units") or {}
    usage = Usage(input=int(billed.get("input_tokens") or 0),
                  output=int(billed.get("output_tokens") or 0))  # fmt: skip
    return Completion(
        text=text, reasoning=None, usage=usage, cost_usd=0.0, endpoint=endpoint, attempts=0,
        latency_s=0.0, model=model, system_fingerprint=None,
        finish_reason=FINISH.get(str(body.get("finish_reason")), "stop"),
    )  # fmt: skip


class CohereTransport:
    """One endpoint's ``factory.llm.client.Transport`` over aiohttp."""

    def __init__(self, endpoint: Endpoint, api_key: str, timeout_s: float):
        self.endpoint = endpoint.name
        self.url = endpoint.base_url.rstrip("/") + "/chat"
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.session: aiohttp.ClientSession | None = None

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers)
        headers = {"X-Client-Request-Id": request_header}
        async with self.session.post(
            self.url, json=chat_body(request, model, params), headers=headers
        ) as r:
            if r.status != 200:
                retry = r.headers.get("Retry-After")
                raise status_error(self.endpoint, r.status, (await r.text())[:200],
                                   float(retry) if retry else None)  # fmt: skip
            return completion_from_cohere(await r.json(), self.endpoint, model)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def build(setup: BackendSetup) -> Backend:
    endpoints = recipe_endpoints(setup, Endpoint(base_url=API, api_key_env=KEY_ENV))
    return ClientBackend(build_llm_client(setup, CohereTransport, endpoints))


plugin = BackendPlugin("cohere", CohereOptions, build)
