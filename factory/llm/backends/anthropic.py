"""Backend ``anthropic``: Anthropic's Messages API, natively (issue 35, point 1).

Why natively and not through an OpenAI-compatible proxy: what makes a 90k-row run
affordable on Claude is prompt caching, and a proxy neither marks the static prefix
(Anthropic caches only what ``cache_control`` marks) nor reports
``cache_creation_input_tokens`` / ``cache_read_input_tokens``. This module is the one
place that reads and writes the Messages wire shape:

- :func:`messages_body`: the neutral ``Request`` as the JSON body of
  ``POST {base}/messages``. System and developer messages become the top-level
  ``system`` array of text blocks; an assistant's tool calls ``tool_use`` blocks; a
  ``tool`` message a ``tool_result`` block in a user turn (consecutive turns of one role
  merged into one, as the API requires after a ``tool_use``); ``Request.tools`` the
  ``tools`` array (``input_schema``). The request's static prefix (the stage's system
  block: policy, tools, instructions) gets ``cache_control: {type: ephemeral}`` on its
  last block, and the last tool too: the API caches in the order tools -> system ->
  messages, so that one mark covers everything before it. No static prefix, no mark
  (a mark on a prefix that changes every call would pay the 1.25x write every time).
- :func:`completion_from_anthropic`: a ``Message`` as the neutral ``Completion``: text
  blocks joined, ``thinking`` blocks as ``reasoning`` (a ``redacted_thinking`` block is
  noted as such: its content is encrypted), ``tool_use`` blocks as tool calls, the stop
  reason in OpenAI's words, and ``usage`` with the input split the neutral way
  (``input`` = input + cache writes + cache reads).
- :func:`anthropic_params`: the recipe's ``llm.sampling`` for the pinned API version.
- :func:`rate_limits_from_headers`: ``anthropic-ratelimit-*`` as ``RateLimits``.

The API version is pinned (``anthropic-version``, option ``api_version``): ``2023-06-01``
by default, the version that still takes ``temperature``/``top_p``; ``2026-10-21`` (the
SDKs' default since 2.0) answers 400 to any of them, even at their defaults, so with it
a recipe's temperature of 1.0 (the model's default) is left out and any other value is
a ``ConfigError`` naming ``llm.sampling.temperature``, before a request is paid.

Two transports, chosen by ``backend_options.client``: ``http`` (the default: a lean
aiohttp poster, the session code of ``factory.llm.http``) and ``sdk`` (the official
``anthropic`` package, its retries off, its key passed explicitly, the pinned version
forced). ``docs/backends.md`` has the measurement that chose the default.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import Field

from factory.core.trajectory import IdentityMemo
from factory.errors import ConfigError, LLMBadRequest, LLMServerError, short
from factory.llm.backends.base import (
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
    CacheTerms,
)
from factory.llm.backends.online import ClientBackend, build_llm_client, recipe_endpoints
from factory.llm.errormap import HTTPStatusFailure
from factory.llm.http import JSONSession
from factory.llm.params import REASONING_EFFORTS, SAMPLING_KEYS
from factory.llm.pool import Endpoint
from factory.llm.types import Completion, Message, RateLimits, Request, Tool, ToolCall, Usage
from factory.secrets import redact

__all__ = [
    "ANTHROPIC_CACHE",
    "ANTHROPIC_VERSION",
    "ANTHROPIC_VERSIONS",
    "DEFAULT_ENDPOINT",
    "DEFAULT_MAX_TOKENS",
    "THINKING_BUDGETS",
    "AnthropicOptions",
    "HTTPTransport",
    "SDKTransport",
    "anthropic_params",
    "completion_from_anthropic",
    "messages_body",
    "plugin",
    "rate_limits_from_headers",
    "usage_from_anthropic",
]

log = logging.getLogger(__name__)

#: The API version this backend speaks unless ``backend_options.api_version`` says
#: otherwise: the one that still takes ``temperature`` (Simia samples at 1.0, and a
#: recipe may ask for less).
ANTHROPIC_VERSION: Final = "2023-06-01"
#: Versions the backend knows what to send to. ``2026-10-21`` refuses every sampling
#: knob (``temperature``, ``top_p``, ``top_k``) with a 400, even at its default value.
ANTHROPIC_VERSIONS = ("2023-06-01", "2026-10-21")
_NO_SAMPLING_VERSIONS = frozenset({"2026-10-21"})

#: ``max_tokens`` when the recipe sets none: the Messages API requires it (OpenAI's does
#: not), and an amplification answer is a few thousand tokens.
DEFAULT_MAX_TOKENS = 16000
#: Extended thinking budgets for ``llm.sampling.reasoning_effort`` (the API's minimum
#: is 1,024; the budget must stay below ``max_tokens``).
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
_MIN_THINKING = 1024
# What the output may hold beside the thinking when max_tokens is not set.
_ANSWER_ROOM = 8192

#: Anthropic's own API and key variable, where the recipe names no ``llm.endpoints``.
DEFAULT_ENDPOINT = Endpoint(
    base_url="https://api.anthropic.com/v1", api_key_env="ANTHROPIC_API_KEY"
)

#: Anthropic's prompt caching: only marked prefixes, 1,024 tokens at least (Claude
#: Sonnet/Opus), kept 5 minutes after their last use
#: (https://docs.claude.com/en/docs/build-with-claude/prompt-caching).
ANTHROPIC_CACHE = CacheTerms(min_tokens=1024, ttl_s=300.0, marked=True)

_EPHEMERAL = {"type": "ephemeral"}
_STATIC_ROLES = ("system", "developer")
_KEY_PATH = "llm.sampling"

# Stop reasons in OpenAI's words (``Completion.finish_reason``); ``pause_turn`` (a
# server tool's long turn, never asked for here) reads as a finished answer.
_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


class AnthropicOptions(BackendOptions):
    """``llm.backend_options`` of ``anthropic``.

    Attributes:
        client: ``http`` (aiohttp, the default) or ``sdk`` (the ``anthropic`` package).
        api_version: the ``anthropic-version`` header; what may be sent follows it.
        thinking_budget: extended thinking's ``budget_tokens`` (at least 1,024), over
            the one ``llm.sampling.reasoning_effort`` maps to; ``None``: that mapping,
            or no thinking when the recipe sets no effort.
    """

    client: Literal["http", "sdk"] = "http"
    api_version: Literal["2023-06-01", "2026-10-21"] = ANTHROPIC_VERSION
    thinking_budget: int | None = Field(None, ge=_MIN_THINKING)


# -- sampling ---------------------------------------------------------------------------
def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"expected a positive integer, got {short(value, 40)}", key_path=f"{_KEY_PATH}.{key}"
        )
    return value


def _unit(key: str, value: Any, lo: float = 0.0, hi: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(
            f"expected a number, got {short(value, 40)}", key_path=f"{_KEY_PATH}.{key}"
        )
    if not lo <= value <= hi:
        raise ConfigError(
            f"{value} is outside [{lo}, {hi}], the range Anthropic's API takes",
            key_path=f"{_KEY_PATH}.{key}",
        )
    return float(value)


_warned: set[tuple[str, str]] = set()


def anthropic_params(
    model: str,
    sampling: Mapping[str, Any],
    *,
    api_version: str = ANTHROPIC_VERSION,
    thinking_budget: int | None = None,
) -> dict[str, Any]:
    """The recipe's ``llm.sampling`` as Messages API parameters for ``api_version``.

    - ``max_tokens`` (or ``max_completion_tokens``) is always sent: the API requires it
      (:data:`DEFAULT_MAX_TOKENS` when unset, more when thinking needs room).
    - ``reasoning_effort`` (or ``thinking_budget``) turns extended thinking on:
      ``thinking: {type: enabled, budget_tokens: N}`` (:data:`THINKING_BUDGETS`). With
      thinking the API takes only temperature 1 and ``top_p`` of 0.95 or more.
    - ``temperature`` and ``top_p`` are sent with ``2023-06-01``; ``2026-10-21`` takes
      neither, so 1.0 (the default) is left out and any other value refused here.
    - ``seed`` is not a Messages parameter: dropped, logged once per model (as
      ``factory.llm.params`` does for a model that takes no seed).

    Raises:
        ConfigError: an unknown key, a bad value, or a value the version or thinking
            does not take, naming ``llm.sampling.<key>``.
    """
    if api_version not in ANTHROPIC_VERSIONS:
        raise ConfigError(
            f"unknown Anthropic API version {api_version!r}; this backend speaks "
            f"{', '.join(ANTHROPIC_VERSIONS)}",
            key_path="llm.backend_options.api_version",
        )
    for key in sampling:
        if key not in SAMPLING_KEYS:
            raise ConfigError(
                f"unknown sampling option {key!r}; expected one of {', '.join(SAMPLING_KEYS)}",
                key_path=f"{_KEY_PATH}.{key}",
            )
    opts = {k: v for k, v in sampling.items() if v is not None}
    if "max_tokens" in opts and "max_completion_tokens" in opts:
        raise ConfigError(
            "give max_tokens or max_completion_tokens, not both (they mean the same here)",
            key_path=f"{_KEY_PATH}.max_completion_tokens",
        )
    budget = thinking_budget
    effort = opts.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ConfigError(
            f"{short(effort, 40)} is not one of {', '.join(REASONING_EFFORTS)}",
            key_path=f"{_KEY_PATH}.reasoning_effort",
        )
    if budget is None and effort is not None:
        budget = THINKING_BUDGETS[effort]
    params: dict[str, Any] = {}
    max_key = "max_tokens" if "max_tokens" in opts else "max_completion_tokens"
    if max_key in opts:
        params["max_tokens"] = _integer(max_key, opts[max_key])
    else:
        params["max_tokens"] = max(DEFAULT_MAX_TOKENS, (budget or 0) + _ANSWER_ROOM)
    if budget is not None:
        if budget >= params["max_tokens"]:
            raise ConfigError(
                f"the thinking budget {budget} must be less than max_tokens "
                f"{params['max_tokens']} (Anthropic counts thinking as output); raise "
                "max_tokens or lower reasoning_effort / backend_options.thinking_budget",
                key_path=f"{_KEY_PATH}.{max_key}",
            )
        params["thinking"] = {"type": "enabled", "budget_tokens": budget}
    no_sampling = api_version in _NO_SAMPLING_VERSIONS
    for key in ("temperature", "top_p"):
        if key not in opts:
            continue
        value = _unit(key, opts[key])
        if no_sampling:
            if value != 1.0:
                raise ConfigError(
                    f"Anthropic API version {api_version} takes no {key} (it answers 400 "
                    f"even to the default); remove it, set it to 1.0 (the model's default, "
                    f"left out), or pin backend_options.api_version: {ANTHROPIC_VERSION}",
                    key_path=f"{_KEY_PATH}.{key}",
                )
            continue  # 1.0 is the model's default: leaving it out changes nothing
        if budget is not None and (
            (key == "temperature" and value != 1.0) or (key == "top_p" and value < 0.95)
        ):
            need = "temperature 1" if key == "temperature" else "top_p of 0.95 or more"
            raise ConfigError(
                f"with extended thinking (reasoning_effort / thinking_budget) Anthropic "
                f"takes only {need}, got {value}",
                key_path=f"{_KEY_PATH}.{key}",
            )
        params[key] = value
    if "seed" in opts and (model, "seed") not in _warned:
        _warned.add((model, "seed"))
        log.warning("sampling option seed dropped: Anthropic's API takes no sampling seed")
    return params


# -- requests ---------------------------------------------------------------------------
def _tool_input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise LLMBadRequest(
            f"tool call {short(call.name, 60)} in the conversation has arguments that are "
            "not a JSON object; Anthropic's tool_use input must be one"
        )
    return value


def _tool(tool: Tool) -> dict[str, Any]:
    schema = dict(tool.parameters) or {"type": "object", "properties": {}}
    out: dict[str, Any] = {"name": tool.name, "input_schema": schema}
    if tool.description:
        out["description"] = tool.description
    return out


def _turn(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """One non-system message as (role, content blocks)."""
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
        if message.content:
            block["content"] = message.content
        return "user", [block]
    blocks: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": _tool_input(call)})  # fmt: skip
    return ("assistant" if message.role == "assistant" else "user"), blocks


def _mark(block: dict[str, Any]) -> None:
    block["cache_control"] = dict(_EPHEMERAL)


def messages_body(request: Request, model: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of ``POST {base}/messages`` for ``request`` (model and ``params``
    included, the static prefix marked for caching; see the module docstring).

    Raises:
        LLMBadRequest: an assistant tool call whose arguments are not a JSON object.
    """
    system: list[dict[str, Any]] = []
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    marked: dict[str, Any] | None = None
    for index, message in enumerate(request.messages):
        if message.role in _STATIC_ROLES:
            block = {"type": "text", "text": message.content}
            system.append(block)
        else:
            role, blocks = _turn(message)
            if turns and turns[-1][0] == role:
                turns[-1][1].extend(blocks)  # one turn per role: tool results merged
            else:
                turns.append((role, blocks))
            block = blocks[-1]
        if index == request.static_prefix - 1:
            marked = block
    body: dict[str, Any] = {"model": model}
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
        if marked is not None:
            _mark(body["tools"][-1])
    if marked is not None:
        _mark(marked)
    if system:
        body["system"] = system
    body["messages"] = [{"role": role, "content": _plain(blocks)} for role, blocks in turns]
    body.update(params)
    return body


def _plain(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone unmarked text block as the plain string the API also takes (smaller)."""
    if len(blocks) == 1 and tuple(blocks[0]) == ("type", "text") and blocks[0]["type"] == "text":
        return str(blocks[0]["text"])
    return blocks


# -- answers ----------------------------------------------------------------------------
def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def usage_from_anthropic(usage: Mapping[str, Any] | None) -> Usage:
    """A Messages ``usage`` block as ``Usage``: Anthropic reports input tokens apart from
    the cache's (``input_tokens`` is only the uncached rest), the neutral ``input`` is all
    three; ``output_tokens`` includes thinking (``output_tokens_details.thinking_tokens``
    where the API states it)."""
    if not usage:
        return Usage()
    uncached = _int(usage.get("input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    output = _int(usage.get("output_tokens"))
    details = usage.get("output_tokens_details") or {}
    thinking = min(_int(details.get("thinking_tokens")), output) if details else 0
    return Usage(
        input=uncached + written + read,
        cached_input=read,
        cache_write=written,
        output=output,
        reasoning=thinking,
    )


def completion_from_anthropic(body: Mapping[str, Any], endpoint: str, model: str) -> Completion:
    """A Messages response body as a ``Completion`` (cost 0, attempts 0: the caller
    prices it and counts its attempts).

    Raises:
        LLMServerError: the body is not a message (no ``content`` list).
    """
    content = body.get("content")
    if not isinstance(content, Sequence) or isinstance(content, str):
        raise LLMServerError(f"{endpoint}: response has no content blocks", endpoint=endpoint)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking":  # encrypted: nothing to read, but it was there
            thoughts.append("[redacted thinking]")
        elif kind == "tool_use":
            raw = block.get("input")
            calls.append(
                ToolCall(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=json.dumps(raw if raw is not None else {}, ensure_ascii=False),
                )
            )
    stop = body.get("stop_reason")
    return Completion(
        text="".join(texts),
        reasoning="\n\n".join(thoughts) if thoughts else None,
        usage=usage_from_anthropic(body.get("usage")),
        cost_usd=0.0,
        endpoint=endpoint,
        attempts=0,
        latency_s=0.0,
        model=str(body.get("model") or model),
        system_fingerprint=None,
        finish_reason=_STOP_REASONS.get(stop, stop) if isinstance(stop, str) else None,
        tool_calls=tuple(calls),
    )


# -- rate-limit headers -----------------------------------------------------------------
def _count(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def _seconds_until(value: str | None, now: datetime) -> float | None:
    """An RFC 3339 time (``2026-10-21T12:00:30Z``) as seconds from ``now`` (0 if past)."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - now).total_seconds(), 0.0)


def rate_limits_from_headers(
    headers: Mapping[str, str], *, now: datetime | None = None
) -> RateLimits | None:
    """``anthropic-ratelimit-*`` headers as ``RateLimits``, ``None`` when there are none.

    Anthropic states requests and tokens per minute, and tokens also split into input and
    output (``-input-tokens-*``, ``-output-tokens-*``). The combined ``-tokens-*`` budget
    is the tightest of them and is read as the token budget; without it, the input one
    (the budget a prompt-heavy run spends). Resets are RFC 3339 times, converted to
    seconds from ``now`` (default: the UTC clock).
    """
    lowered = {
        k.lower(): v for k, v in headers.items() if k.lower().startswith("anthropic-ratelimit-")
    }
    if not lowered:
        return None
    now = now or datetime.now(UTC)

    def get(kind: str, field: str) -> str | None:
        return lowered.get(f"anthropic-ratelimit-{kind}-{field}")

    tokens = "tokens" if get("tokens", "remaining") is not None else "input-tokens"
    limits = RateLimits(
        requests_limit=_count(get("requests", "limit")),
        requests_remaining=_count(get("requests", "remaining")),
        requests_reset_s=_seconds_until(get("requests", "reset"), now),
        tokens_limit=_count(get(tokens, "limit")),
        tokens_remaining=_count(get(tokens, "remaining")),
        tokens_reset_s=_seconds_until(get(tokens, "reset"), now),
    )
    return limits if limits.known else None


# -- transports -------------------------------------------------------------------------
class _Params:
    """A request's sampling as Messages parameters, mapped once per sampling object (a
    stage's requests share one), not per call. The transports read this, not the
    ``params`` ``LLMClient`` passes: those are the OpenAI families' mapping."""

    def __init__(self, model: str, sampling: Mapping[str, Any], options: AnthropicOptions):
        self.options = options
        self._sampling = sampling
        self._memo: IdentityMemo[Mapping[str, Any], dict[str, Any]] = IdentityMemo(
            lambda s: anthropic_params(
                model, s, api_version=options.api_version, thinking_budget=options.thinking_budget
            )
        )

    def of(self, request: Request) -> dict[str, Any]:
        return self._memo(request.sampling if request.sampling is not None else self._sampling)


class HTTPTransport:
    """One endpoint's ``factory.llm.client.Transport`` over aiohttp (``POST
    {base}/messages``, ``x-api-key`` and the pinned ``anthropic-version``)."""

    def __init__(self, endpoint: Endpoint, api_key: str, timeout_s: float, params: _Params) -> None:
        self.http = JSONSession(timeout_s)
        self.url = endpoint.base_url.rstrip("/") + "/messages"
        self.endpoint = endpoint.name
        self.params = params
        self._headers = {
            "x-api-key": api_key,
            "anthropic-version": params.options.api_version,
            "content-type": "application/json",
        }

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        payload = messages_body(request, model, self.params.of(request))
        data = json.dumps(payload, ensure_ascii=False).encode()
        headers = {**self._headers, "X-Client-Request-Id": request_header}
        try:
            body, resp_headers = await self.http.request_json("POST", self.url, data, headers)
        except HTTPStatusFailure as exc:
            if exc.status == 429:  # a refusal states the budget too: the pacer re-bases
                exc.rate_limits = rate_limits_from_headers(exc.headers)
            raise
        completion = completion_from_anthropic(body, self.endpoint, model)
        return _with_limits(completion, resp_headers)

    async def close(self) -> None:
        await self.http.close()


def _with_limits(completion: Completion, headers: Mapping[str, str]) -> Completion:
    limits = rate_limits_from_headers(headers)
    if limits is None:
        return completion
    return replace(completion, rate_limits=limits)


_SDK_EXTRA = ("temperature", "top_p", "top_k")


def _sdk_failure(exc: Exception, endpoint: str) -> Exception:
    """The SDK's exception as what ``factory.llm.errormap`` translates (it knows the
    openai SDK's classes, not this one's): a status as ``HTTPStatusFailure`` (the one
    status table, ``retry-after`` and the redacted detail), a timeout as ``TimeoutError``,
    a failed connection as the ``LLMServerError`` it means; anything else as it is."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        response = exc.response
        return HTTPStatusFailure(exc.status_code, response.content, dict(response.headers))
    if isinstance(exc, anthropic.APITimeoutError):
        return TimeoutError()
    if isinstance(exc, anthropic.APIConnectionError):
        return LLMServerError(
            f"{endpoint}: connection failed: {short(redact(str(exc)), 200)}", endpoint=endpoint
        )
    return exc


class SDKTransport:
    """One endpoint's ``Transport`` over ``anthropic.AsyncAnthropic``.

    Args:
        sdk: the SDK client (tests pass a stand-in with ``messages.with_raw_response``).
    """

    def __init__(self, endpoint: Endpoint, sdk: Any, params: _Params) -> None:
        self.sdk = sdk
        self.endpoint = endpoint.name
        self.params = params

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        body = messages_body(request, model, self.params.of(request))
        # The SDK's create() (2.x) has no temperature / top_p: its default version takes
        # none. The pinned 2023-06-01 does, so they travel in the body as they are.
        extra = {k: body.pop(k) for k in _SDK_EXTRA if k in body}
        try:
            raw = await self.sdk.messages.with_raw_response.create(
                **body,
                extra_body=extra or None,
                extra_headers={"X-Client-Request-Id": request_header},
            )
            message = await raw.parse()
        except Exception as exc:
            raise _sdk_failure(exc, self.endpoint) from exc
        answer = message.model_dump() if hasattr(message, "model_dump") else dict(message)
        completion = completion_from_anthropic(answer, self.endpoint, model)
        return _with_limits(completion, raw.headers)

    async def close(self) -> None:
        close = getattr(self.sdk, "close", None)
        if close is not None:
            await close()


def sdk_client(endpoint: Endpoint, api_key: str, timeout_s: float, api_version: str) -> Any:
    """``AsyncAnthropic`` for ``endpoint``: SDK retries off (``LLMClient`` retries), the key
    passed explicitly (the SDK never reads ``ANTHROPIC_API_KEY`` itself), the base URL
    without the ``/v1`` the SDK adds, the pinned version forced. The SDK (2.x) sends the key
    as ``Authorization: Bearer``, as ``2026-10-21`` expects; with ``2023-06-01`` it goes as
    ``x-api-key``, the header that version documents."""
    import anthropic

    base = endpoint.base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    headers: dict[str, Any] = {"anthropic-version": api_version}
    if api_version not in _NO_SAMPLING_VERSIONS:
        headers.update({"x-api-key": api_key, "Authorization": anthropic.omit})
    return anthropic.AsyncAnthropic(
        api_key=api_key,
        base_url=base,
        timeout=timeout_s,
        max_retries=0,
        default_headers=headers,
    )


def _transports(
    model: str, sampling: Mapping[str, Any], options: AnthropicOptions
) -> Callable[[Endpoint, str, float], HTTPTransport | SDKTransport]:
    """``LLMClient``'s client factory for ``options.client``."""
    params = _Params(model, sampling, options)

    def make(endpoint: Endpoint, api_key: str, timeout_s: float) -> HTTPTransport | SDKTransport:
        if options.client == "sdk":
            sdk = sdk_client(endpoint, api_key, timeout_s, options.api_version)
            return SDKTransport(endpoint, sdk, params)
        return HTTPTransport(endpoint, api_key, timeout_s, params)

    return make


def build(setup: BackendSetup) -> Backend:
    options = setup.options
    assert isinstance(options, AnthropicOptions)
    # Map once here: a bad sampling option fails the build (before any request is paid).
    anthropic_params(
        setup.model,
        setup.llm.sampling,
        api_version=options.api_version,
        thinking_budget=options.thinking_budget,
    )
    endpoints = recipe_endpoints(setup, DEFAULT_ENDPOINT)
    return ClientBackend(
        build_llm_client(setup, _transports(setup.model, setup.llm.sampling, options), endpoints)
    )


plugin = BackendPlugin("anthropic", AnthropicOptions, build, cache=ANTHROPIC_CACHE)
