"""The development server's Anthropic Messages API: ``POST /v1/messages`` (issue 35, point 6).

Why a translation and not a second simulator: the answer's content, the defects, the
queueing and the latency must be the ones the chat-completions route serves, so a run
against ``llm.backend: anthropic`` behaves like one against the OpenAI wire. A request
becomes a chat-completions body (:func:`chat_payload`), is answered by ``serve_chat``,
and the answer is translated back (:func:`message_from_chat`), its status and headers
too. What is Anthropic's own is done here, as its docs describe it:

- **The version header.** ``anthropic-version`` is required (400 without it). With
  ``2026-10-21`` any ``temperature``, ``top_p`` or ``top_k`` is a 400
  ``invalid_request_error``, even at its default; ``2023-06-01`` takes them.
- **The key.** ``x-api-key`` must be present (401 ``authentication_error`` otherwise;
  any value passes: the server holds no keys). ``Authorization: Bearer`` is how the
  SDKs send a key with ``2026-10-21`` and is accepted with that version only.
- **Prompt caching.** Only marked prefixes are cached: the request's prefix up to its
  last ``cache_control`` block, in the order tools -> system -> messages, of at least
  1,024 tokens. The first request with a prefix (per model and prefix, looked up when it
  arrives) pays ``cache_creation_input_tokens``; later ones within 5 minutes of the last
  use read it (``cache_read_input_tokens``); ``input_tokens`` is the rest. No mark, no
  cache: Anthropic caches nothing by itself.
- **Thinking.** A request with ``thinking: {type: enabled}`` gets a ``thinking`` block
  (with a signature) before the text; its tokens count as output.
- **Errors** in Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``):
  ``rate_limit_error`` (429, ``retry-after``), ``api_error`` (500), ``overloaded_error``
  (529: the ``server_error`` defect answers it with ``anthropic_overloaded``),
  ``invalid_request_error``, ``authentication_error``, ``not_found_error``.
- **Rate-limit headers.** The chat core's ``x-ratelimit-*`` headers (``--rpm``/``--tpm``)
  become ``anthropic-ratelimit-requests-*`` and ``-tokens-*`` (+ ``-input-tokens-*``; the
  server has one token bucket), resets as RFC 3339 times.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

__all__ = [
    "CACHE_MIN_TOKENS",
    "CACHE_TTL_S",
    "VERSIONS",
    "MarkedCache",
    "ServeChat",
    "add_routes",
    "anthropic_headers",
    "chat_payload",
    "error_body",
    "marked_prefix",
    "message_from_chat",
    "parse_duration",
]

VERSIONS = ("2023-06-01", "2026-10-21")
_NO_SAMPLING = frozenset({"2026-10-21"})
_BEARER_VERSIONS = frozenset({"2026-10-21"})
_SAMPLING_KEYS = ("temperature", "top_p", "top_k")
CACHE_TTL_S = 300.0  # the 5-minute cache, refreshed by each read
CACHE_MIN_TOKENS = 1024  # Claude Sonnet / Opus: shorter prefixes are not cached
_CACHE_KEPT = 10_000

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4  # the chat core's estimate


# -- errors -----------------------------------------------------------------------------
def error_body(status: int, message: str) -> dict[str, Any]:
    """An error as Anthropic answers it (the type follows the status)."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(status, message)),
        content_type="application/json",
        headers=headers,
    )


# -- requests ---------------------------------------------------------------------------
def _text(content: Any) -> str:
    """A content value's text: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(
            str(b.get("text") or "")
            for b in content
            if isinstance(b, Mapping) and b.get("type") == "text"
        )
    return ""


def _result_text(block: Mapping[str, Any]) -> str:
    content = block.get("content")
    return _text(content) if content is not None else ""


def chat_payload(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as a chat-completions body: ``system`` blocks as
    system messages, ``tool_use`` blocks as an assistant's ``tool_calls``, each
    ``tool_result`` block as a ``tool`` message, ``tools`` as functions; ``max_tokens``
    and the sampling knobs carried over (``thinking`` is not a chat parameter)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    elif isinstance(system, list):
        for block in system:
            if isinstance(block, Mapping) and block.get("type") == "text":
                messages.append({"role": "system", "content": str(block.get("text") or "")})
    for turn in body.get("messages") or []:
        role, content = turn.get("role"), turn.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        blocks = [b for b in content or [] if isinstance(b, Mapping)]
        for block in blocks:
            if block.get("type") == "tool_result":
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": _result_text(block),
                    }
                )
        texts = [b for b in blocks if b.get("type") == "text"]
        calls = [b for b in blocks if b.get("type") == "tool_use"]
        if texts or calls:
            message: dict[str, Any] = {"role": role, "content": _text(texts)}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": str(c.get("id") or ""),
                        "type": "function",
                        "function": {
                            "name": str(c.get("name") or ""),
                            "arguments": json.dumps(c.get("input") or {}, ensure_ascii=False),
                        },
                    }
                    for c in calls
                ]
            messages.append(message)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("tools"):
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {},
                },
            }
            for t in body["tools"]
            if isinstance(t, Mapping)
        ]
    for key in ("max_tokens", "temperature", "top_p"):
        if key in body:
            chat[key] = body[key]
    return chat


def _problem(body: Any, version: str | None, headers: Mapping[str, str]) -> web.Response | None:
    """What the API would refuse before answering, as its error response."""
    if version is None:
        return _error(400, "anthropic-version: header is required")
    if version not in VERSIONS:
        return _error(400, f"anthropic-version: invalid version {version!r}")
    bearer = headers.get("Authorization", "").startswith("Bearer ")
    if not headers.get("x-api-key") and not (bearer and version in _BEARER_VERSIONS):
        return _error(401, "x-api-key header is required")
    if not isinstance(body, dict):
        return _error(400, "The request body is not a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _error(400, "model: Field required")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return _error(400, "max_tokens: Field required (a positive integer)")
    if body.get("stream"):
        return _error(400, "stream: streaming is not supported by the factory devserver")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _error(400, "messages: at least one message is required")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            role = m.get("role") if isinstance(m, dict) else None
            return _error(
                400,
                f"messages.{i}.role: Unexpected role {role!r}. The Messages API accepts a "
                'top-level `system` parameter, not "system" as an input message role.',
            )
        if not isinstance(m.get("content"), str | list):
            return _error(400, f"messages.{i}.content: Field required")
    sent = [k for k in _SAMPLING_KEYS if k in body]
    if version in _NO_SAMPLING and sent:
        return _error(
            400, f"{sent[0]}: is not supported with anthropic-version {version}; remove it"
        )
    temperature = body.get("temperature")
    if temperature is not None and not (
        isinstance(temperature, int | float) and 0.0 <= temperature <= 1.0
    ):
        return _error(400, "temperature: Input should be less than or equal to 1")
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return _error(400, "thinking.enabled.budget_tokens: Input should be >= 1024")
        if budget >= max_tokens:
            return _error(400, "`max_tokens` must be greater than `thinking.budget_tokens`.")
        if temperature is not None and temperature != 1:
            return _error(400, "`temperature` may only be set to 1 when thinking is enabled.")
    return None


# -- prompt caching ---------------------------------------------------------------------
def _strip_marks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_marks(v) for v in value]
    return value


def marked_prefix(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """The request's marked prefix as (canonical text, estimated tokens): everything up to
    the last block with ``cache_control``, in the order tools -> system -> messages; None
    when nothing is marked."""
    parts: list[Any] = []
    seen: list[Any] = []  # everything so far, in caching order
    tokens = 0
    upto = 0
    for tool in body.get("tools") or []:
        seen.append(tool)
        tokens += _tokens(json.dumps(_strip_marks(tool)))
        if isinstance(tool, Mapping) and "cache_control" in tool:
            parts, upto = list(seen), tokens
    system = body.get("system")
    blocks = system if isinstance(system, list) else []
    if isinstance(system, str):
        seen.append(system)
        tokens += _tokens(system)
    for block in blocks:
        seen.append(block)
        tokens += _tokens(_text([block]))
        if isinstance(block, Mapping) and "cache_control" in block:
            parts, upto = list(seen), tokens
    for turn in body.get("messages") or []:
        content = turn.get("content") if isinstance(turn, Mapping) else None
        turn_blocks = content if isinstance(content, list) else [content]
        tokens += 4
        for block in turn_blocks:
            seen.append(block)
            tokens += _tokens(block if isinstance(block, str) else json.dumps(_strip_marks(block)))
            if isinstance(block, Mapping) and "cache_control" in block:
                parts, upto = list(seen), tokens
    if not parts:
        return None
    return json.dumps(_strip_marks(parts), sort_keys=True), upto


class MarkedCache:
    """The server's Anthropic prompt cache: prefix hash -> when it was last used."""

    def __init__(self, ttl_s: float = CACHE_TTL_S, min_tokens: int = CACHE_MIN_TOKENS):
        self.ttl_s = ttl_s
        self.min_tokens = min_tokens
        self._used: OrderedDict[bytes, float] = OrderedDict()

    def lookup(
        self, model: str, body: Mapping[str, Any], now: float
    ) -> tuple[bytes, int, bool] | None:
        """(key, prefix tokens, cached) of the request's marked prefix as it arrives, or
        None: nothing marked, or a prefix too short to cache."""
        prefix = marked_prefix(body)
        if prefix is None or prefix[1] < self.min_tokens:
            return None
        text, tokens = prefix
        key = hashlib.blake2b(f"{model}\x1f{text}".encode(), digest_size=16).digest()
        used = self._used.get(key)
        return key, tokens, used is not None and now - used <= self.ttl_s

    def use(self, key: bytes, now: float) -> None:
        """The prefix was written or read at ``now`` (its TTL starts again)."""
        self._used[key] = now
        self._used.move_to_end(key)
        while len(self._used) > _CACHE_KEPT:
            self._used.popitem(last=False)


def _account(chat: dict[str, Any], hit: tuple[bytes, int, bool] | None) -> None:
    """Rewrite the chat answer's usage with Anthropic's cache split (the chat core's own
    prefix cache, which caches every prefix, does not apply to this API)."""
    usage = chat.setdefault("usage", {})
    prompt = int(usage.get("prompt_tokens") or 0)
    details: dict[str, int] = {"cached_tokens": 0, "cache_write_tokens": 0}
    if hit is not None:
        _key, tokens, cached = hit
        tokens = min(tokens, prompt)
        details["cached_tokens" if cached else "cache_write_tokens"] = tokens
    usage["prompt_tokens_details"] = details


# -- answers ----------------------------------------------------------------------------
_THOUGHT = (
    "The request gives a policy, the tools and a reference; I will follow the policy, "
    "call only the listed tools, and answer in the format the prompt asks for."
)


def message_from_chat(chat: dict[str, Any], *, thinking: bool = False) -> dict[str, Any]:
    """A ``chat.completion`` as an Anthropic ``Message``: text and ``tool_use`` blocks
    (a ``thinking`` block with a signature first when ``thinking``), the stop reason in
    Anthropic's words, and ``usage`` with the cache fields (the chat usage's
    ``cached_tokens`` are cache reads, its ``cache_write_tokens`` cache writes;
    ``input_tokens`` is the rest)."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    content: list[dict[str, Any]] = []
    thought_tokens = 0
    if thinking:
        digest = hashlib.blake2b(f"{_THOUGHT}\x1f{text}".encode(), digest_size=32).digest()
        content.append(
            {
                "type": "thinking",
                "thinking": _THOUGHT,
                "signature": base64.b64encode(digest).decode(),
            }
        )
        thought_tokens = _tokens(_THOUGHT)
    if text or not message.get("tool_calls"):
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    usage = chat.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    read = int(details.get("cached_tokens") or 0)
    written = int(details.get("cache_write_tokens") or 0)
    output = int(usage.get("completion_tokens") or 0) + thought_tokens
    out_usage: dict[str, Any] = {
        "input_tokens": max(prompt - read - written, 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output,
        "service_tier": "standard",
    }
    if thinking:
        out_usage["output_tokens_details"] = {"thinking_tokens": thought_tokens}
    finish = choice.get("finish_reason")
    chat_id = str(chat.get("id") or "")
    return {
        "id": "msg_" + chat_id.removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model"),
        "content": content,
        "stop_reason": _STOP_REASONS.get(finish, "end_turn"),
        "stop_sequence": None,
        "usage": out_usage,
    }


# -- headers ----------------------------------------------------------------------------
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(text: str) -> float | None:
    """OpenAI's reset duration (``1s``, ``6m0s``, ``59.5ms``, ``1h2m3s``) in seconds."""
    text = text.strip()
    if not text:
        return None
    pos, total = 0, 0.0
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * scale[match.group(2)]
        pos = match.end()
    return total if pos == len(text) else None


def _rfc3339(now: datetime, seconds: float) -> str:
    return (now + timedelta(seconds=seconds)).isoformat(timespec="seconds").replace("+00:00", "Z")


def anthropic_headers(headers: Mapping[str, str], *, now: datetime | None = None) -> dict[str, str]:
    """The answer's headers for the Messages API: OpenAI's ``x-ratelimit-*`` as
    ``anthropic-ratelimit-*`` (reset durations as RFC 3339 times from ``now``) and
    ``retry-after`` kept; the chat core's other headers are not the API's."""
    lowered = {k.lower(): v for k, v in headers.items()}
    now = now or datetime.now(UTC)
    out: dict[str, str] = {}
    for kind, names in (("requests", ("requests",)), ("tokens", ("tokens", "input-tokens"))):
        for field in ("limit", "remaining", "reset"):
            value = lowered.get(f"x-ratelimit-{field}-{kind}")
            if value is None:
                continue
            if field == "reset":
                seconds = parse_duration(value)
                if seconds is None:
                    continue
                value = _rfc3339(now, seconds)
            for name in names:
                out[f"anthropic-ratelimit-{name}-{field}"] = value
    if "retry-after" in lowered:
        out["retry-after"] = lowered["retry-after"]
    return out


# -- the route --------------------------------------------------------------------------
_CACHE: web.AppKey[MarkedCache] = web.AppKey("anthropic_cache", MarkedCache)


#: ``factory.devserver.app.serve_chat``: answers a chat body (passed in: ``app`` imports
#: this module, and the package's modules import no cycle).
ServeChat = Callable[[web.Request, bytes | None], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application, hooks: Any, serve_chat: ServeChat) -> None:
    """Serve ``POST /v1/messages`` on ``app`` (``hooks.config``: the server's config),
    answering through ``serve_chat``."""
    app[_CACHE] = MarkedCache()
    overloaded = bool(getattr(hooks.config, "anthropic_overloaded", False))

    async def messages(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        problem = _problem(body, request.headers.get("anthropic-version"), request.headers)
        if problem is not None:
            return problem
        cache = request.app[_CACHE]
        hit = cache.lookup(body["model"], body, time.monotonic())
        chat = chat_payload(body)
        answer = await serve_chat(request, json.dumps(chat, ensure_ascii=False).encode())
        assert isinstance(answer, web.Response)  # serve_chat never streams
        headers = anthropic_headers(answer.headers)
        text = answer.text or ""
        if answer.status >= 400:
            try:
                detail = json.loads(text).get("error", {}).get("message") or text
            except (ValueError, AttributeError):
                detail = text
            status = 529 if answer.status == 500 and overloaded else answer.status
            if status == 529:
                detail = "Overloaded"
            return _error(status, str(detail), headers)
        result = json.loads(text)
        if hit is not None:
            cache.use(hit[0], time.monotonic())
        _account(result, hit)
        thinking = isinstance(body.get("thinking"), Mapping) and (
            body["thinking"].get("type") == "enabled"
        )
        message = message_from_chat(result, thinking=thinking)
        headers["request-id"] = "req_" + message["id"].removeprefix("msg_")
        return web.Response(
            text=json.dumps(message, ensure_ascii=False),
            content_type="application/json",
            headers=headers,
        )

    app.router.add_post("/v1/messages", messages)
