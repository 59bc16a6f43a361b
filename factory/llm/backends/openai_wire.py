"""OpenAI's wire shape, read and written in one place for every OpenAI-compatible backend.

The ``aiohttp``, ``openai`` (SDK), ``openai_batch`` and ``ray_data`` backends all speak
chat completions; each sends :func:`chat_messages` and maps the answer it reads with
:func:`completion_from_openai` (and its ``usage`` block with :func:`usage_from_openai`),
so nothing above ``factory.llm.backends`` reads ``choices`` or ``prompt_tokens``
(issue 34, point 5; ``tests/llm/test_neutral_edge.py`` greps for them).

One more thing keeps OpenAI's names: the factory's own token record, a row's ``usage``
column and a manifest's ``tokens`` (``prompt_tokens``, ``completion_tokens``,
``cached_tokens``), written with these names since before the neutral edge and read by
users' tools. :func:`tokens_record` and :func:`tokens_usage` are its one writer and
reader, so the names stay as they are on disk while the code reads ``Usage`` fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from factory.errors import LLMServerError
from factory.llm.types import Completion, Message, RateLimits, ToolCall, Usage

__all__ = [
    "chat_messages",
    "completion_from_openai",
    "message_to_openai",
    "parse_duration",
    "rate_limits_from_headers",
    "tokens_record",
    "tokens_usage",
    "usage_from_openai",
]

# The factory's token record (row ``usage``, manifest ``tokens``): OpenAI's names.
_PROMPT, _COMPLETION, _CACHED, _CACHE_WRITE = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


# -- requests ---------------------------------------------------------------------------
def message_to_openai(m: Message) -> dict[str, Any]:
    """One message as a chat-completions message. A plain one is ``{"role", "content"}``
    in that order: ``factory.llm.http`` reuses the JSON of a long static one by it."""
    if not m.tool_calls and m.tool_call_id is None:
        return {"role": m.role, "content": m.content}
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def chat_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a chat-completions body."""
    return [message_to_openai(m) for m in messages]


# -- answers ----------------------------------------------------------------------------
def usage_from_openai(usage: Mapping[str, Any] | None) -> Usage:
    """A chat-completions ``usage`` block as ``Usage``.

    OpenAI counts cached tokens inside ``prompt_tokens`` and reasoning tokens inside
    ``completion_tokens``; some OpenAI-compatible servers report reasoning beside
    ``completion_tokens`` instead, recognised from ``total_tokens``, so reasoning counts
    as output exactly once either way.
    """
    if not usage:
        return Usage()
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    cached = min(_int(prompt_details.get("cached_tokens")), prompt)
    reasoning = _int(completion_details.get("reasoning_tokens"))
    if reasoning and _int(usage.get("total_tokens")) == prompt + completion + reasoning:
        completion += reasoning  # reported beside completion_tokens, not inside it
    return Usage(input=prompt, cached_input=cached, output=completion, reasoning=reasoning)


def _text(message: Mapping[str, Any], name: str) -> str | None:
    value = message.get(name)
    return value if isinstance(value, str) and value else None


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    if not isinstance(raw, Sequence) or not raw:
        return ()
    calls = []
    for call in raw:
        function = (call or {}).get("function") or {}
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=str(call.get("id") or ""),
                name=str(function.get("name") or ""),
                arguments=arguments if isinstance(arguments, str) else "",
            )
        )
    return tuple(calls)


def completion_from_openai(body: Mapping[str, Any], endpoint: str, model: str) -> Completion:
    """A chat-completions response body as a ``Completion`` (cost 0, attempts 0: the
    caller prices it and counts its attempts).

    Raises:
        LLMServerError: the body has no choice or no message (a broken server).
    """
    choices = body.get("choices")
    if not choices:
        raise LLMServerError(f"{endpoint}: response has no choices", endpoint=endpoint)
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        raise LLMServerError(f"{endpoint}: response choice has no message", endpoint=endpoint)
    return Completion(
        text=message.get("content") or "",
        reasoning=_text(message, "reasoning_content") or _text(message, "reasoning"),
        usage=usage_from_openai(body.get("usage")),
        cost_usd=0.0,
        endpoint=endpoint,
        attempts=0,
        latency_s=0.0,
        model=body.get("model") or model,
        system_fingerprint=body.get("system_fingerprint"),
        finish_reason=choice.get("finish_reason"),
        tool_calls=_tool_calls(message.get("tool_calls")),
    )


# -- the rate-limit budget ---------------------------------------------------------------
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str) -> float | None:
    """A reset time as OpenAI writes it (Go's duration format: ``1s``, ``6m0s``,
    ``59.5ms``, ``2m59.56s``; a bare number is seconds) in seconds, or None when it is
    not one."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if 0 <= seconds < math.inf else None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _header_duration(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    return parse_duration(value) if value is not None else None


def rate_limits_from_headers(headers: Mapping[str, str]) -> RateLimits | None:
    """OpenAI's budget headers (``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``,
    platform.openai.com/docs/guides/rate-limits) as ``RateLimits``; None when the answer
    states no budget (vLLM, SGLang), so the client does not pace that endpoint.

    ``headers`` must match names case-insensitively (aiohttp's and httpx's do); a value
    that is not a number or a duration reads as absent.
    """
    if (
        "x-ratelimit-remaining-requests" not in headers
        and "x-ratelimit-remaining-tokens" not in headers
    ):
        return None  # the common case of a local server: two lookups and out
    limits = RateLimits(
        requests_limit=_header_int(headers, "x-ratelimit-limit-requests"),
        requests_remaining=_header_int(headers, "x-ratelimit-remaining-requests"),
        requests_reset_s=_header_duration(headers, "x-ratelimit-reset-requests"),
        tokens_limit=_header_int(headers, "x-ratelimit-limit-tokens"),
        tokens_remaining=_header_int(headers, "x-ratelimit-remaining-tokens"),
        tokens_reset_s=_header_duration(headers, "x-ratelimit-reset-tokens"),
    )
    return limits if limits.known else None


# -- the factory's token record ---------------------------------------------------------
def tokens_record(usage: Usage) -> dict[str, int]:
    """A row's ``usage`` column / a manifest's ``tokens`` (``cache_write_tokens`` only
    when a provider wrote to its cache: OpenAI-compatible servers never report it)."""
    out = {_PROMPT: usage.input, _COMPLETION: usage.output, _CACHED: usage.cached_input}
    if usage.cache_write:
        out[_CACHE_WRITE] = usage.cache_write
    return out


def tokens_usage(record: Mapping[str, Any] | None) -> Usage:
    """The inverse of :func:`tokens_record` (a missing count is 0; ``None``: no usage)."""
    if not record:
        return Usage()
    return Usage(
        input=_int(record.get(_PROMPT)),
        cached_input=_int(record.get(_CACHED)),
        cache_write=_int(record.get(_CACHE_WRITE)),
        output=_int(record.get(_COMPLETION)),
    )
