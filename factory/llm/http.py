"""A lean HTTP transport for OpenAI-compatible chat completions (aiohttp).

Why a second transport: at hundreds of completions per second the openai SDK's
per-request work (typed-dict transforms, httpx connection bookkeeping, pydantic
response models) cost ~5 ms of CPU per call inside a Ray actor on this 2-core
machine, more than the rest of the pipeline together, and capped throughput at
about half of what the servers allowed (BENCHMARKS.md). This transport sends
the same request body and reads the same response, with one JSON encode and
one JSON decode per call. ``llm.transport: openai`` keeps the SDK.

A prompt's static block, its system message, is the same for every call of a stage
(23 KB in the airline recipe): ``encode_body`` encodes a long system message once and
splices it into each body, byte for byte what ``json.dumps`` writes (77 -> 17 us a
body of 29 KB).

It posts a body and returns the decoded JSON answer; the ``aiohttp`` backend
(``factory.llm.backends.aiohttp``) builds the body from the neutral request and maps
the answer to the neutral completion (``factory.llm.backends.openai_wire``).
HTTP failures are raised as foreign errors (``aiohttp.ClientError``,
``errormap.HTTPStatusFailure``, ``errormap.UnusableResponse``) and translated by
``LLMClient`` with the one error map that also translates the SDK's
(``factory.llm.errormap``); timeouts are enforced by ``LLMClient`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from factory.llm.errormap import HTTPStatusFailure, UnusableResponse
from factory.llm.pool import Endpoint

__all__ = ["HTTPChatClient", "JSONSession", "encode_body"]

# A system message this long is encoded once and its JSON reused.
_REUSED_CHARS = 2048
_REUSED_KEPT = 64  # encoded messages kept (a run has one static block per stage)
_STATIC_ROLES = ("system", "developer")
_encoded: dict[tuple[str, str], str] = {}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _message_json(message: Any) -> str:
    if (
        isinstance(message, dict)
        and tuple(message) == ("role", "content")  # the key order is part of the bytes
        and message["role"] in _STATIC_ROLES
        and isinstance(message["content"], str)
        and len(message["content"]) >= _REUSED_CHARS
    ):
        key = (message["role"], message["content"])
        text = _encoded.get(key)
        if text is None:
            if len(_encoded) >= _REUSED_KEPT:
                _encoded.clear()
            text = _encoded[key] = _dumps(message)
        return text
    return _dumps(message)


def encode_body(payload: dict[str, Any]) -> bytes:
    """``json.dumps(payload, ensure_ascii=False).encode()``, with each long message
    encoded once per process (see the module's docstring)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not all(isinstance(k, str) for k in payload):
        return _dumps(payload).encode()
    parts = []
    for key, value in payload.items():
        if key == "messages":
            text = "[" + ", ".join(_message_json(m) for m in messages) + "]"
        else:
            text = _dumps(value)
        parts.append(f"{_dumps(key)}: {text}")
    return ("{" + ", ".join(parts) + "}").encode()


class JSONSession:
    """One endpoint's HTTP session (built lazily inside the running event loop) that sends
    a JSON body and reads a JSON object back: what every online wire format needs (chat
    completions here, Anthropic's Messages and Gemini's generateContent in their backend
    modules), so each provider module maps bodies and answers, never sockets."""

    def __init__(self, timeout_s: float):
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def request_json(
        self,
        method: str,
        url: str,
        data: bytes | str | None,
        headers: Mapping[str, str],
        *,
        empty: bool = False,
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """Send ``data`` (a JSON body, or none); the JSON object answered and the answer's
        headers (case-insensitive: a provider states its rate-limit budget there).
        ``empty``: an empty body is ``{}`` (a DELETE's answer), not a broken answer.

        Raises:
            HTTPStatusFailure: a status of 400 or more (its body and headers kept).
            UnusableResponse: a body that is not a JSON object.
            aiohttp.ClientError: the connection failed.
        """
        async with self._get_session().request(method, url, data=data, headers=headers) as resp:
            raw = await resp.read()
            status = resp.status
            resp_headers = resp.headers
        if status >= 400:
            raise HTTPStatusFailure(status, raw, resp_headers)
        if empty and not raw:
            return {}, resp_headers
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            # a prefix only: the error map shows 120 characters of it, redacted
            raise UnusableResponse(raw[:1000].decode("utf-8", "replace")) from exc
        if not isinstance(answer, dict):
            raise UnusableResponse(raw[:1000].decode("utf-8", "replace"))
        return answer, resp_headers

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


class HTTPChatClient(JSONSession):
    """One endpoint's chat-completions client: ``POST {base}/chat/completions``."""

    def __init__(self, endpoint: Endpoint, api_key: str, timeout_s: float):
        super().__init__(timeout_s)
        self.url = endpoint.base_url.rstrip("/") + "/chat/completions"
        self.name = endpoint.name
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    async def post_chat(
        self, payload: dict[str, Any], request_id: str
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """POST ``payload`` (``request_id`` as ``X-Client-Request-Id``); the JSON answer and
        the answer's headers (``openai_wire.rate_limits_from_headers`` reads the budget).

        Raises:
            HTTPStatusFailure, UnusableResponse, aiohttp.ClientError: as ``request_json``.
        """
        headers = {**self._headers, "X-Client-Request-Id": request_id}
        return await self.request_json("POST", self.url, encode_body(payload), headers)
