"""Backend ``gemini``: Google's Gemini API, ``generateContent`` spoken natively.

Why natively and not through Google's OpenAI-compatible endpoint: that layer drops what a
90k-row run pays for, the explicit context cache (``cachedContents``) and the exact token
accounting (``usageMetadata``: cached and thinking tokens apart), and it lags the native API.

The wire (https://ai.google.dev/api/generate-content): the request's leading system and
developer messages become ``systemInstruction`` (first, and byte for byte the same in
every request of a stage, so Google's implicit cache can reuse it), the others
``contents`` with the roles ``user`` and ``model``; native tools become
``tools: [{functionDeclarations}]``, a model's ``functionCall`` part a ``ToolCall`` (with
an id made from the call, since Gemini sends none) and a ``tool`` message a
``functionResponse`` part under the name of the call it answers. Thinking
(``thinkingConfig``) comes back as parts marked ``thought: true``: the completion's
``reasoning``. ``usageMetadata.promptTokenCount`` includes the cached tokens
(``cachedContentTokenCount``) and ``candidatesTokenCount`` excludes the thoughts
(``thoughtsTokenCount``), so ``Usage.output`` is candidates + thoughts.

The API version is pinned (``backend_options.api_version``, default ``v1beta``): the
context cache (``cachedContents``) and the Batch API are documented under ``v1beta``
only, and google-genai 3.x defaults to ``/v1``; the version segment of the endpoint's URL
is replaced by the pinned one, so the same wire is spoken whatever the recipe's URL
ends in (the development server's ``/v1`` included).

Two clients carry a request (``backend_options.client``): plain HTTP over aiohttp (the
default, measured in docs/backends.md) and the official ``google-genai`` SDK (its own
retries off: ``LLMClient`` retries). The key goes in the ``x-goog-api-key`` header, never
in the URL (URLs are logged). The explicit context cache is ``gemini_cache``'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator

from factory.core.trajectory import IdentityMemo
from factory.errors import ConfigError, LLMBadRequest, LLMError, LLMServerError, short
from factory.llm.backends.base import (
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
    CacheTerms,
)
from factory.llm.backends.gemini_cache import (
    CacheBook,
    ExplicitCache,
    min_cache_tokens,
)
from factory.llm.backends.online import ClientBackend, build_llm_client, recipe_endpoints
from factory.llm.errormap import HTTPStatusFailure, status_error
from factory.llm.http import JSONSession
from factory.llm.params import resolve_params
from factory.llm.pool import Endpoint
from factory.llm.retry import parse_retry_after
from factory.llm.types import Completion, Message, Request, Tool, ToolCall, Usage
from factory.secrets import redact

__all__ = [
    "API_VERSION",
    "DEFAULT_BASE_URL",
    "GEMINI_CACHE",
    "GeminiOptions",
    "completion_from_gemini",
    "endpoint_url",
    "gemini_error",
    "gemini_params",
    "generate_body",
    "plugin",
    "retry_delay_s",
    "usage_from_gemini",
]

log = logging.getLogger(__name__)

API_VERSION = "v1beta"
DEFAULT_BASE_URL = f"https://generativelanguage.googleapis.com/{API_VERSION}"
KEY_VARS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")  # Google's SDKs read them in this order
API_VERSIONS = ("v1", "v1beta", "v1alpha")
_VERSION_SEGMENT = re.compile(r"/(v\d+(?:alpha|beta)?\d*)/*$")

# Implicit caching of Gemini 2.5 and later: prefixes of at least 2,048 tokens on 2.5 Flash
# and Pro in the current docs, 1,024 (Flash) and 4,096 (Pro) in earlier versions of the page
# (https://ai.google.dev/gemini-api/docs/caching); 4,096 is the largest any version states
# for a 2.5 or 3 model, so the plan's estimate never counts a cache read that is not made.
# No TTL is documented for the implicit cache: OpenAI's 5 minutes are assumed.
GEMINI_CACHE = CacheTerms(min_tokens=4096, ttl_s=300.0, marked=False, explicit_cache=True)

# reasoning_effort -> thinkingBudget on Gemini 2.5, as Google's OpenAI-compatible layer maps
# it (https://ai.google.dev/gemini-api/docs/openai: low 1K, medium 8K, high 24K); minimal
# turns thinking off where the model allows it (2.5 Pro thinks at least 128 tokens).
_BUDGETS = {"minimal": 0, "low": 1024, "medium": 8192, "high": 24576}
_PRO_MIN_BUDGET = 128

# finishReason (https://ai.google.dev/api/generate-content#FinishReason) in OpenAI's words.
_FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "LANGUAGE": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "IMAGE_RECITATION": "content_filter",
}
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


class GeminiOptions(BackendOptions):
    """``llm.backend_options`` of the ``gemini`` backend."""

    client: Literal["http", "sdk"] = Field(
        "http", description="plain HTTP (aiohttp) or the official google-genai SDK"
    )
    api_version: Literal["v1", "v1beta", "v1alpha"] = Field(
        "v1beta",
        description="the API version spoken (replaces the version segment of the URL)",
    )
    include_thoughts: bool = Field(
        True, description="ask for thought summaries when thinking is configured"
    )
    thinking_budget: int | None = Field(
        None, ge=-1, description="thinkingBudget (-1 dynamic, 0 off); overrides reasoning_effort"
    )
    explicit_cache: Literal["auto", "on", "off"] = Field(
        "auto", description="hold each stage's static prefix in a cachedContents cache"
    )
    explicit_cache_ttl_s: float = Field(
        600.0, gt=0, description="TTL of an explicit cache (refreshed while it is used)"
    )
    cache_storage_per_mtok_hour: float | None = Field(
        None, ge=0, description="USD per million cached tokens per hour (the price table's)"
    )
    cache_decide_after_s: float = Field(
        30.0, ge=0, description="auto: requests are counted this long before deciding"
    )

    @field_validator("explicit_cache", mode="before")
    @classmethod
    def _yaml_switch(cls, value: Any) -> Any:
        """YAML reads a bare ``on``/``off`` as a boolean: take it as the word it was."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value


# -- sampling ---------------------------------------------------------------------------
def _thinking_budget(model: str, effort: str) -> int:
    budget = _BUDGETS[effort]
    if "pro" in model.lower():
        return max(budget, _PRO_MIN_BUDGET)
    return budget


def gemini_params(
    model: str,
    sampling: Mapping[str, Any],
    *,
    include_thoughts: bool = True,
    thinking_budget: int | None = None,
) -> dict[str, Any]:
    """The recipe's ``llm.sampling`` as a ``generationConfig`` for ``model``.

    ``temperature`` (0-2), ``top_p``, ``max_tokens`` (``maxOutputTokens``, which bounds the
    thoughts too) and ``seed`` are sent as given; ``reasoning_effort`` becomes a
    ``thinkingConfig``: a ``thinkingLevel`` on Gemini 3, a ``thinkingBudget`` on 2.5
    (``thinking_budget``, a backend option, overrides it). Thought summaries are asked
    for (``includeThoughts``) whenever thinking is configured, unless turned off.

    Raises:
        ConfigError: an unknown key or a bad value, naming ``llm.sampling.KEY``.
    """
    checked = resolve_params(model, sampling)  # validates every key (ConfigError names it)
    values = dict(checked.params)
    config: dict[str, Any] = {}
    if "temperature" in values:
        config["temperature"] = values["temperature"]
    if "top_p" in values:
        config["topP"] = values["top_p"]
    limit = values.get("max_tokens", values.get("max_completion_tokens"))
    if limit is not None:
        config["maxOutputTokens"] = limit
    if "seed" in values:
        config["seed"] = values["seed"]
    effort = sampling.get("reasoning_effort")
    thinking: dict[str, Any] = {}
    if thinking_budget is not None:
        thinking["thinkingBudget"] = thinking_budget
    elif effort is not None and re.match(r"^(?:models/)?gemini-[3-9]", model):
        thinking["thinkingLevel"] = effort
    elif effort is not None:
        thinking["thinkingBudget"] = _thinking_budget(model, effort)
    if thinking:
        if include_thoughts and thinking.get("thinkingBudget") != 0:
            thinking["includeThoughts"] = True
        config["thinkingConfig"] = thinking
    return config


# -- requests ---------------------------------------------------------------------------
def _text_part(text: str) -> dict[str, Any]:
    return {"text": text}


def _function_declaration(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    if tool.parameters:
        out["parameters"] = dict(tool.parameters)
    return out


def tools_body(tools: Iterable[Tool]) -> list[dict[str, Any]]:
    """``tools`` of a request: one Tool holding every function declaration."""
    declarations = [_function_declaration(t) for t in tools]
    return [{"functionDeclarations": declarations}] if declarations else []


def _args(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as the object ``functionCall.args`` must be."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}  # kept, not lost: the model wrote text, not JSON
    return value if isinstance(value, dict) else {"arguments": value}


def _response(content: str) -> dict[str, Any]:
    """A tool's result as ``functionResponse.response`` (a JSON object: ``output`` holds a
    result that is not one, as Google's docs ask)."""
    try:
        value = json.loads(content)
    except ValueError:
        return {"output": content}
    return value if isinstance(value, dict) else {"output": value}


def _contents(messages: Iterable[Message], names: dict[str, str]) -> list[dict[str, Any]]:
    """Messages as ``contents``: consecutive turns of one role merged (Gemini alternates
    user and model; a turn's function responses travel together). ``names`` maps each
    tool call id seen so far to its function's name (filled in as calls are read)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            role = "model"
            parts = [_text_part(m.content)] if m.content else []
            for call in m.tool_calls:
                names[call.id] = call.name
                parts.append({"functionCall": {"name": call.name, "args": _args(call.arguments)}})
        elif m.role == "tool":
            role = "user"
            name = names.get(m.tool_call_id or "")
            if name is None:
                raise LLMBadRequest(
                    f"a tool message answers the call {m.tool_call_id!r}, which no earlier "
                    "assistant message made: Gemini needs the function's name"
                )
            parts = [{"functionResponse": {"name": name, "response": _response(m.content)}}]
        else:  # user, or a system message after the conversation started
            role = "user"
            parts = [_text_part(m.content)]
        if not parts:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["parts"].extend(parts)
        else:
            out.append({"role": role, "parts": parts})
    return out


def split_system(messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """The leading system/developer messages (the ``systemInstruction``) and the rest."""
    n = 0
    while n < len(messages) and messages[n].role in ("system", "developer"):
        n += 1
    return messages[:n], messages[n:]


def system_instruction(system: Iterable[Message]) -> dict[str, Any] | None:
    """``systemInstruction``: one text part per system message, or None without one."""
    parts = [_text_part(m.content) for m in system]
    return {"parts": parts} if parts else None


def generate_body(
    request: Request,
    model: str,
    params: Mapping[str, Any],
    *,
    cached_content: str | None = None,
    cached_messages: int = 0,
) -> dict[str, Any]:
    """The JSON body of ``POST {base}/models/{model}:generateContent`` (the model is in the
    path, not the body).

    Args:
        request: the neutral request.
        model: the model (unused in the body; kept for the signature every wire shares).
        params: the ``generationConfig`` (:func:`gemini_params`).
        cached_content: the name of an explicit cache holding the request's first
            ``cached_messages`` messages and its tools (``cachedContents/...``): they are
            left out, as the API requires of a request naming a cache.
        cached_messages: how many leading messages the cache holds.

    Raises:
        LLMBadRequest: a tool message answers a call no earlier message made.
    """
    del model
    names: dict[str, str] = {}
    messages = request.messages
    body: dict[str, Any] = {}
    if cached_content is not None:
        for m in messages[:cached_messages]:  # their calls name later tool messages
            for call in m.tool_calls:
                names[call.id] = call.name
        body["cachedContent"] = cached_content
        rest = messages[cached_messages:]
    else:
        system, rest = split_system(messages)
        instruction = system_instruction(system)
        if instruction is not None:
            body["systemInstruction"] = instruction
        if request.tools:
            body["tools"] = tools_body(request.tools)
    body["contents"] = _contents(rest, names)
    if params:
        body["generationConfig"] = dict(params)
    return body


# -- answers ----------------------------------------------------------------------------
def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def usage_from_gemini(meta: Mapping[str, Any] | None) -> Usage:
    """``usageMetadata`` as ``Usage``: the prompt includes the cached content (and the
    results of tools Google ran, ``toolUsePromptTokenCount``); the output is the candidates
    plus the thoughts, which ``candidatesTokenCount`` leaves out."""
    if not meta:
        return Usage()
    prompt = _int(meta.get("promptTokenCount")) + _int(meta.get("toolUsePromptTokenCount"))
    thoughts = _int(meta.get("thoughtsTokenCount"))
    return Usage(
        input=prompt,
        cached_input=min(_int(meta.get("cachedContentTokenCount")), prompt),
        output=_int(meta.get("candidatesTokenCount")) + thoughts,
        reasoning=thoughts,
    )


def _call_id(index: int, call: Mapping[str, Any]) -> str:
    """Gemini's own id when it sends one, else one made from the call (the same answer
    replayed from the response cache keeps its ids)."""
    given = call.get("id")
    if isinstance(given, str) and given:
        return given
    digest = hashlib.blake2b(
        json.dumps([index, call.get("name"), call.get("args")], sort_keys=True).encode(),
        digest_size=8,
    ).hexdigest()
    return f"call_{digest}"


def completion_from_gemini(body: Mapping[str, Any], endpoint: str, model: str) -> Completion:
    """A ``GenerateContentResponse`` as a ``Completion`` (cost 0, attempts 0: the client
    prices it and counts its attempts).

    A prompt Google blocked (``promptFeedback.blockReason``, no candidate) is an empty
    answer with ``finish_reason`` ``content_filter``: it was paid, and its row fails.

    Raises:
        LLMServerError: no candidate and no reason (a broken answer).
    """
    usage = usage_from_gemini(body.get("usageMetadata"))
    version = body.get("modelVersion")
    answered = version if isinstance(version, str) and version else model
    candidates = body.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        feedback = body.get("promptFeedback") or {}
        if isinstance(feedback, Mapping) and feedback.get("blockReason"):
            return Completion("", None, usage, 0.0, endpoint, 0, 0.0, answered, None,
                              finish_reason="content_filter")  # fmt: skip
        raise LLMServerError(f"{endpoint}: response has no candidates", endpoint=endpoint)
    candidate = candidates[0] if isinstance(candidates[0], Mapping) else {}
    content = candidate.get("content") or {}
    parts = content.get("parts") if isinstance(content, Mapping) else None
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, Mapping):
            continue
        call = part.get("functionCall")
        if isinstance(call, Mapping):
            args = call.get("args")
            calls.append(
                ToolCall(
                    id=_call_id(len(calls), call),
                    name=str(call.get("name") or ""),
                    arguments=json.dumps(args if args is not None else {}, ensure_ascii=False),
                )
            )
            continue
        text = part.get("text")
        if isinstance(text, str):
            (thoughts if part.get("thought") is True else texts).append(text)
    reason = candidate.get("finishReason")
    finish = _FINISH.get(reason, reason.lower()) if isinstance(reason, str) else None
    if calls and finish == "stop":
        finish = "tool_calls"  # Gemini says STOP after a function call; OpenAI says this
    return Completion(
        text="".join(texts),
        reasoning="".join(thoughts) or None,
        usage=usage,
        cost_usd=0.0,
        endpoint=endpoint,
        attempts=0,
        latency_s=0.0,
        model=answered,
        system_fingerprint=None,
        finish_reason=finish,
        tool_calls=tuple(calls),
    )


# -- errors -----------------------------------------------------------------------------
def retry_delay_s(error: Any) -> float | None:
    """Seconds Google asks to wait: ``RetryInfo.retryDelay`` (``"7s"``, ``"0.5s"``) among an
    error's ``details``, in ``{"error": {...}}`` or the bare error object; else None."""
    inner = error.get("error", error) if isinstance(error, Mapping) else None
    details = inner.get("details") if isinstance(inner, Mapping) else None
    for item in details if isinstance(details, list) else ():
        if isinstance(item, Mapping) and item.get("@type") == _RETRY_INFO:
            delay = item.get("retryDelay")
            if isinstance(delay, Mapping):  # the proto's JSON may be {seconds, nanos}
                return _int(delay.get("seconds")) + _int(delay.get("nanos")) / 1e9
            match = _DURATION.match(delay) if isinstance(delay, str) else None
            if match:
                return float(match.group(1))
    return None


def _message(error: Any) -> str:
    inner = error.get("error", error) if isinstance(error, Mapping) else None
    message = inner.get("message") if isinstance(inner, Mapping) else None
    status = inner.get("status") if isinstance(inner, Mapping) else None
    text = message if isinstance(message, str) else ""
    if isinstance(status, str) and status:
        text = f"{status}: {text}" if text else status
    return short(redact(text), 200)


def gemini_error(
    endpoint: str, status: int, error: Any, headers: Mapping[str, str] | None = None
) -> LLMError:
    """An error answer (Google's shape, ``{"error": {code, message, status, details}}``)
    as the factory's error: ``RetryInfo`` (or a ``Retry-After`` header) becomes the wait a
    429 asks for."""
    retry_after = retry_delay_s(error)
    if retry_after is None and headers is not None:
        retry_after = parse_retry_after(headers)
    return status_error(endpoint, status, _message(error), retry_after)


def _decode_error(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": {"message": raw[:300].decode("utf-8", "replace")}}


# -- transports -------------------------------------------------------------------------
def endpoint_url(base_url: str, api_version: str) -> str:
    """The endpoint's URL speaking ``api_version``: its trailing version segment replaced,
    or the version appended where it has none.

    Raises:
        ConfigError: a query string in the URL (where a key would be logged).
    """
    parts = urlsplit(base_url)
    if parts.query:
        raise ConfigError(
            "the Gemini endpoint URL must have no query string (the key goes in the "
            "x-goog-api-key header, from api_key_env)",
            key_path="llm.endpoints.base_url",
        )
    path = _VERSION_SEGMENT.sub("", parts.path.rstrip("/")) + f"/{api_version}"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Wire:
    """What both transports share: the generation config of a request's sampling, and
    the explicit cache of this endpoint."""

    def __init__(self, model: str, options: GeminiOptions, sampling: Mapping[str, Any]):
        self.options = options
        self.default_params = self._params(model, sampling)
        self._params_of: IdentityMemo[Mapping[str, Any], dict[str, Any]] = IdentityMemo(
            lambda s: self._params(model, s)
        )

    def _params(self, model: str, sampling: Mapping[str, Any]) -> dict[str, Any]:
        return gemini_params(
            model,
            sampling,
            include_thoughts=self.options.include_thoughts,
            thinking_budget=self.options.thinking_budget,
        )

    def params(self, request: Request) -> dict[str, Any]:
        """The ``generationConfig`` of ``request`` (its own sampling, else the recipe's:
        ``LLMClient`` passes the OpenAI family's mapping, which drops ``reasoning_effort``
        for a model it does not know as a reasoning one)."""
        if request.sampling is None:
            return self.default_params
        return self._params_of(request.sampling)


class HTTPTransport:
    """One endpoint's ``Transport`` over aiohttp."""

    def __init__(self, endpoint: Endpoint, api_key: str, timeout_s: float, wire: _Wire,
                 cache: ExplicitCache | None) -> None:  # fmt: skip
        self.endpoint = endpoint.name
        self.base = endpoint_url(endpoint.base_url, wire.options.api_version)
        self.wire = wire
        self.cache = cache
        self._headers = {"x-goog-api-key": api_key, "Content-Type": "application/json"}
        self.http = JSONSession(timeout_s)

    async def call(
        self, method: str, path: str, body: Mapping[str, Any] | None, request_header: str = ""
    ) -> dict[str, Any]:
        """One call of the API (``path`` below the versioned base): its JSON answer.

        Raises:
            LLMError: an error status, in Google's shape, translated.
            UnusableResponse: a body that is not a JSON object.
            aiohttp.ClientError: the connection failed.
        """
        headers = dict(self._headers)
        if request_header:
            headers["X-Client-Request-Id"] = request_header
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode()
        url = f"{self.base}/{path}"
        try:
            answer, _ = await self.http.request_json(method, url, data, headers, empty=True)
        except HTTPStatusFailure as failure:  # Google's error shape: its own reading
            raise gemini_error(
                self.endpoint, failure.status, _decode_error(failure.body), failure.headers
            ) from None
        return answer

    async def _generate(self, body: dict[str, Any], model: str, header: str) -> dict[str, Any]:
        return await self.call("POST", f"models/{model}:generateContent", body, header)

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        del params  # the OpenAI family's mapping: this wire maps the sampling itself
        config = self.wire.params(request)
        return await _send_cached(self, self._generate, request, model, config, request_header)

    async def close(self) -> None:
        if self.cache is not None:
            await self.cache.aclose(self)
        await self.http.close()


class SDKTransport:
    """One endpoint's ``Transport`` over the google-genai SDK (``client.aio.models``).

    The explicit cache's calls (create, refresh, delete) go over plain HTTP
    (``HTTPTransport.call``) whichever client sends the requests: one implementation of
    the cache's lifecycle and its accounting.

    Args:
        sdk: the ``genai.Client`` (tests pass a stand-in with ``aio.models.generate_content``).
    """

    def __init__(self, endpoint: Endpoint, sdk: Any, http: HTTPTransport) -> None:
        self.endpoint = endpoint.name
        self.sdk = sdk
        self.http = http
        self.wire = http.wire
        self.cache = http.cache

    async def call(
        self, method: str, path: str, body: Mapping[str, Any] | None, request_header: str = ""
    ) -> dict[str, Any]:
        return await self.http.call(method, path, body, request_header)

    async def _generate(self, body: dict[str, Any], model: str, header: str) -> dict[str, Any]:
        from google.genai import errors as genai_errors

        config: dict[str, Any] = dict(body.get("generationConfig") or {})
        for key in ("systemInstruction", "tools", "cachedContent"):
            if key in body:
                config[key] = body[key]
        config["httpOptions"] = {"headers": {"X-Client-Request-Id": header}}
        try:
            response = await self.sdk.aio.models.generate_content(
                model=model, contents=body["contents"], config=config
            )
        except genai_errors.APIError as exc:
            raise gemini_error(self.endpoint, int(exc.code or 500), exc.details) from None
        if isinstance(response, Mapping):
            return dict(response)
        dumped: dict[str, Any] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dumped

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        del params
        config = self.wire.params(request)
        return await _send_cached(self, self._generate, request, model, config, request_header)

    async def close(self) -> None:
        await self.http.close()
        aio = getattr(self.sdk, "aio", None)
        aclose = getattr(aio, "aclose", None)
        if aclose is not None:
            await aclose()


async def _send_cached(
    transport: HTTPTransport | SDKTransport,
    generate: Any,
    request: Request,
    model: str,
    config: dict[str, Any],
    header: str,
) -> Completion:
    """Send ``request`` naming the endpoint's explicit cache of its static prefix when it
    holds one; a cache the server no longer knows (expired, deleted) is forgotten and the
    request sent once more with its prefix inline."""
    cache = transport.cache
    name = await cache.name_for(transport, request, model) if cache is not None else None
    if name is not None:
        body = generate_body(
            request, model, config, cached_content=name, cached_messages=request.static_prefix
        )
        try:
            answer = await generate(body, model, header)
        except LLMBadRequest as exc:
            if cache is None or exc.status not in (400, 403, 404):
                raise
            cache.forget(name, str(exc))
        else:
            return completion_from_gemini(answer, transport.endpoint, model)
    answer = await generate(generate_body(request, model, config), model, header)
    return completion_from_gemini(answer, transport.endpoint, model)


def _sdk_client(base: str, api_key: str, timeout_s: float) -> Any:
    from google import genai
    from google.genai import types as genai_types

    root, _, version = base.rpartition("/")
    return genai.Client(
        api_key=api_key,
        http_options=genai_types.HttpOptions(
            base_url=root + "/",
            api_version=version,
            timeout=int(timeout_s * 1000),
            retry_options=genai_types.HttpRetryOptions(attempts=1),  # LLMClient retries
        ),
    )


def default_endpoint() -> Endpoint:
    """Google's API with ``GEMINI_API_KEY`` (or ``GOOGLE_API_KEY`` where only it is set),
    where the recipe names no endpoint."""
    var = next((v for v in KEY_VARS if os.environ.get(v)), KEY_VARS[0])
    return Endpoint(base_url=DEFAULT_BASE_URL, api_key_env=var, name="gemini")


class GeminiBackend(ClientBackend):
    """The ``LLMClient`` over Gemini transports, plus the explicit caches' storage: each
    completion carries the storage charged since the previous one (``CacheBook``), so the
    ledger, the budget and the manifest count it with the tokens."""

    def __init__(self, client: Any, book: CacheBook) -> None:
        super().__init__(client)
        self.book = book

    async def complete(self, request: Request) -> Completion:
        completion = await self.client.complete(request)
        storage = self.book.take()
        if storage:
            completion = replace(completion, cost_usd=completion.cost_usd + storage)
        return completion

    def totals(self) -> Mapping[str, float]:
        out = dict(self.client.totals())
        out["cost_usd"] = out.get("cost_usd", 0.0) + self.book.charged_usd
        out.update(self.book.totals())
        return out


def build(setup: BackendSetup) -> Backend:
    options = setup.options
    assert isinstance(options, GeminiOptions)
    model = setup.model
    book = CacheBook()
    wire = _Wire(model, options, setup.llm.sampling)
    storage_rate = options.cache_storage_per_mtok_hour
    if storage_rate is None and setup.price is not None:
        storage_rate = getattr(setup.price, "cache_storage_per_mtok_hour", None)

    def cache_for() -> ExplicitCache | None:
        if options.explicit_cache == "off":
            return None
        return ExplicitCache(
            model=model,
            mode=options.explicit_cache,
            ttl_s=options.explicit_cache_ttl_s,
            min_tokens=min_cache_tokens(model),
            price=setup.price,
            storage_per_mtok_hour=storage_rate,
            decide_after_s=options.cache_decide_after_s,
            book=book,
            wire=_CacheWire(),
        )

    def transport(endpoint: Endpoint, api_key: str, timeout_s: float) -> Any:
        http = HTTPTransport(endpoint, api_key, timeout_s, wire, cache_for())
        if options.client == "http":
            return http
        return SDKTransport(endpoint, _sdk_client(http.base, api_key, timeout_s), http)

    client = build_llm_client(setup, transport, recipe_endpoints(setup, default_endpoint()))
    return GeminiBackend(client, book)


class _CacheWire:
    """How the explicit cache writes its ``cachedContents`` body: this module's mapping of
    the static messages and tools (the cache module knows no wire)."""

    @staticmethod
    def cache_body(request: Request, model: str, ttl_s: float) -> dict[str, Any]:
        system, rest = split_system(request.static)
        body: dict[str, Any] = {"model": f"models/{model}"}
        instruction = system_instruction(system)
        if instruction is not None:
            body["systemInstruction"] = instruction
        if rest:
            body["contents"] = _contents(rest, {})
        if request.tools:
            body["tools"] = tools_body(request.tools)
        body["ttl"] = f"{ttl_s:g}s"
        return body


plugin = BackendPlugin("gemini", GeminiOptions, build, cache=GEMINI_CACHE)
