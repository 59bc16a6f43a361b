"""The development server's Gemini API: ``generateContent`` and ``cachedContents``.

Why: the ``gemini`` backend (``factory.llm.backends.gemini``) must be tested offline
against the contract Google serves (https://ai.google.dev/api/generate-content,
https://ai.google.dev/api/caching). A ``generateContent`` request is translated into a
chat-completions body (:func:`chat_payload`), answered by the chat core
(``app.serve_chat``: defects, queueing, latency, content and prefix-cache accounting are
one implementation) and translated back (:func:`response_from_chat`), errors included, in
Google's shape (``{"error": {code, message, status, details}}``, a 429 with
``google.rpc.RetryInfo``).

Served under ``/v1`` and ``/v1beta`` alike (``POST /{version}/models/{model}:{method}``:
one route captures ``model:method``; methods other than ``generateContent`` are found in
the methods :func:`register_method` adds, as the Batch API's ``batchGenerateContent``).
``cachedContents`` are kept in memory with their TTL: create, get, patch (``ttl``) and
delete; a request naming an unknown or expired cache gets 404, one naming a cache and
setting its own ``systemInstruction`` or ``tools`` 400 (as the API refuses it), and the
cache's tokens are reported as ``cachedContentTokenCount``. A request must carry its key
(``x-goog-api-key`` or ``key=``), as the real API needs one: 401 otherwise.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from factory.devserver.batches import BatchHooks

__all__ = [
    "ServeChat",
    "add_routes",
    "chat_payload",
    "google_error",
    "normalize",
    "register_method",
    "response_from_chat",
]

ServeChat = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]
Method = Callable[[web.Request, str], Awaitable[web.StreamResponse]]

VERSIONS = ("v1", "v1beta")
DEFAULT_TTL_S = 3600.0  # a cache's TTL when the request sets none (Google's default)
_THOUGHT = (
    "**Reading the request**\n\nThe prompt states what to write and in which format; "
    "I follow it step by step and check the answer against it before writing it."
)
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP",
           "content_filter": "SAFETY"}  # fmt: skip
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4  # the chat core's estimate


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def google_error(status: int, message: str, *, retry_delay_s: float | None = None) -> web.Response:
    """An error answer in Google's shape (``google.rpc.Status`` as JSON); a 429 carries
    ``RetryInfo`` with the delay (``"7s"``)."""
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": _STATUS.get(status, "UNKNOWN" if status < 500 else "INTERNAL"),
    }
    if retry_delay_s is not None:
        info = {"@type": _RETRY_INFO, "retryDelay": f"{retry_delay_s:g}s"}
        error["details"] = [info]
    return web.json_response({"error": error}, status=status)


# -- requests ---------------------------------------------------------------------------
def _part_texts(parts: Any) -> str:
    return "".join(p["text"] for p in parts or () if isinstance(p, dict) and "text" in p)


def chat_payload(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A ``generateContent`` request as a chat-completions body: each ``systemInstruction``
    part a system message, ``user``/``model`` contents user/assistant messages,
    ``functionCall`` parts tool calls (ids ``call_N``) and ``functionResponse`` parts tool
    messages answering the latest call of their name; ``generationConfig`` as sampling.

    Raises:
        ValueError: the body is not a request (no ``contents`` list), with the reason.
    """
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise ValueError("contents is required and must be a non-empty list")
    messages: list[dict[str, Any]] = []
    system = body.get("systemInstruction") or {}
    for part in system.get("parts") or () if isinstance(system, dict) else ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            messages.append({"role": "system", "content": part["text"]})
    calls = 0
    open_calls: dict[str, list[str]] = {}  # function name -> ids of calls not yet answered
    for content in contents:
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
            raise ValueError("each content needs a parts list")
        role = content.get("role") or "user"
        if role not in ("user", "model"):
            raise ValueError(f"role must be user or model, got {role!r}")
        if role == "model":
            said = [p for p in content["parts"] if not (isinstance(p, dict) and p.get("thought"))]
            message: dict[str, Any] = {"role": "assistant", "content": _part_texts(said)}
            tool_calls = []
            for part in content["parts"]:
                call = part.get("functionCall") if isinstance(part, dict) else None
                if isinstance(call, dict):
                    call_id = f"call_{calls}"
                    calls += 1
                    open_calls.setdefault(str(call.get("name")), []).append(call_id)
                    function = {
                        "name": call.get("name"),
                        "arguments": json.dumps(call.get("args") or {}),
                    }
                    tool_calls.append({"id": call_id, "type": "function", "function": function})
            if tool_calls:
                message["tool_calls"] = tool_calls
            messages.append(message)
            continue
        text = []
        for part in content["parts"]:
            response = part.get("functionResponse") if isinstance(part, dict) else None
            if isinstance(response, dict):
                pending = open_calls.get(str(response.get("name"))) or [f"call_{calls}"]
                answer = json.dumps(response.get("response") or {})
                messages.append({"role": "tool", "tool_call_id": pending.pop(0), "content": answer})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                text.append(part["text"])
        if text:
            messages.append({"role": "user", "content": "".join(text)})
    payload: dict[str, Any] = {"model": model.removeprefix("models/"), "messages": messages}
    declarations = [
        d for tool in body.get("tools") or () if isinstance(tool, dict)
        for d in tool.get("functionDeclarations") or ()
    ]  # fmt: skip
    if declarations:
        payload["tools"] = [{"type": "function", "function": d} for d in declarations]
    config = body.get("generationConfig") or {}
    for key, chat_key in (("maxOutputTokens", "max_tokens"), ("temperature", "temperature"),
                          ("topP", "top_p"), ("seed", "seed")):  # fmt: skip
        if key in config:
            payload[chat_key] = config[key]
    return payload


def _thinking(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(the model thinks, its thoughts are returned), from ``thinkingConfig``."""
    config = (body.get("generationConfig") or {}).get("thinkingConfig")
    if not isinstance(config, dict):
        return False, False
    thinks = config.get("thinkingBudget") != 0
    return thinks, thinks and config.get("includeThoughts") is True


# -- answers ----------------------------------------------------------------------------
def response_from_chat(
    chat: Mapping[str, Any],
    *,
    thoughts: bool = False,
    thought_text: str | None = None,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """A ``chat.completion`` as a ``GenerateContentResponse``.

    Args:
        chat: the chat core's answer.
        thoughts: the model thought (``thoughtsTokenCount`` is reported, outside
            ``candidatesTokenCount`` as Google counts it).
        thought_text: the thought summary returned as a ``thought: true`` part, if asked.
        cached_tokens: tokens of an explicit cache the request named (at least those
            are reported cached; the chat core's prefix cache may report more).
    """
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    thought_tokens = 0
    if thoughts:
        summary = thought_text if thought_text is not None else _THOUGHT
        thought_tokens = 2 * _tokens(summary)  # a summary is shorter than the thinking
        if thought_text is not None:
            parts.append({"text": thought_text, "thought": True})
    if message.get("content"):
        parts.append({"text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
        except ValueError:
            args = {}
        parts.append({"functionCall": {"name": function.get("name"), "args": args}})
    usage = chat.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    candidates = int(usage.get("completion_tokens") or 0)
    reported = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    cached = max(reported, min(cached_tokens, prompt))
    meta: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thought_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if cached:
        meta["cachedContentTokenCount"] = cached
        meta["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    if thought_tokens:
        meta["thoughtsTokenCount"] = thought_tokens
    finish = choice.get("finish_reason") or "stop"
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": parts},
                "finishReason": _FINISH.get(finish, "OTHER"),
                "index": 0,
            }
        ],
        "usageMetadata": meta,
        "modelVersion": chat.get("model"),
        "responseId": str(chat.get("id") or uuid.uuid4().hex),
    }


# -- context caches ---------------------------------------------------------------------
@dataclass
class _Cache:
    name: str
    model: str
    inputs: dict[str, Any]  # systemInstruction, contents, tools: input only, never returned
    tokens: int
    created: float
    updated: float
    expires: float
    display_name: str = ""

    def public(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "model": self.model,
            "createTime": _stamp(self.created),
            "updateTime": _stamp(self.updated),
            "expireTime": _stamp(self.expires),
            "usageMetadata": {"totalTokenCount": self.tokens},
        }
        if self.display_name:
            out["displayName"] = self.display_name
        return out


@dataclass
class _Gemini:
    """The caches of one server and the methods registered beside ``generateContent``."""

    hooks: BatchHooks
    serve: ServeChat
    caches: dict[str, _Cache] = field(default_factory=dict)
    methods: dict[str, Method] = field(default_factory=dict)

    def live(self, name: str) -> _Cache | None:
        cache = self.caches.get(name)
        if cache is not None and cache.expires <= time.time():
            del self.caches[name]
            return None
        return cache


_GEMINI: web.AppKey[_Gemini] = web.AppKey("gemini", _Gemini)


def register_method(app: web.Application, method: str, handler: Method) -> None:
    """Serve ``POST /{version}/models/{model}:{method}`` with ``handler(request, model)``."""
    app[_GEMINI].methods[method] = handler


def _ttl(body: Mapping[str, Any], now: float) -> float | str:
    """The expiry a create or patch asks for (``ttl`` or ``expireTime``), or the error."""
    if "ttl" in body:
        match = _DURATION.match(str(body["ttl"]))
        if not match:
            return f'Invalid value for ttl: {body["ttl"]!r} (a duration such as "600s")'
        return now + float(match.group(1))
    if "expireTime" in body:
        try:
            when = datetime.fromisoformat(str(body["expireTime"]).replace("Z", "+00:00"))
        except ValueError:
            return f"Invalid value for expireTime: {body['expireTime']!r}"
        return when.timestamp()
    return now + DEFAULT_TTL_S


def _has_key(request: web.Request) -> bool:
    return bool(request.headers.get("x-goog-api-key") or request.query.get("key"))


_USER_DATA = ("args", "response", "parameters", "parametersJsonSchema", "responseSchema")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def normalize(value: Any) -> Any:
    """A request with every field name in lowerCamelCase: Google's JSON parser takes a
    proto field's own name too (``include_thoughts``, what the SDK sends inside a config
    it got as a dict), so the server reads both. Function arguments, responses and
    schemas are the user's data and keep their names."""
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        name = _camel(key) if isinstance(key, str) else key
        out[name] = item if name in _USER_DATA else normalize(item)
    return out


async def _json(request: web.Request) -> dict[str, Any] | None:
    try:
        body = json.loads(await request.read())
    except ValueError:
        return None
    return normalize(body) if isinstance(body, dict) else None


_NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)


async def _create_cache(request: web.Request) -> web.Response:
    state = request.app[_GEMINI]
    if not _has_key(request):
        return google_error(401, _NO_KEY)
    body = await _json(request)
    model = body.get("model") if body is not None else None
    if body is None or not isinstance(model, str) or not model.startswith("models/"):
        return google_error(400, "model is required, as models/{model}.")
    now = time.time()
    expires = _ttl(body, now)
    if isinstance(expires, str):
        return google_error(400, expires)
    keys: tuple[str, ...] = ("systemInstruction", "contents", "tools")
    inputs: dict[str, Any] = {k: body[k] for k in keys if k in body}
    probe = {**inputs, "contents": inputs.get("contents") or [{"role": "user", "parts": []}]}
    try:
        messages = chat_payload(probe, model)
    except ValueError as exc:
        return google_error(400, str(exc))
    tokens = sum(_tokens(m.get("content") or "") + 4 for m in messages["messages"])
    if messages.get("tools"):
        tokens += _tokens(json.dumps(messages["tools"]))
    minimum = state.hooks.config.gemini_cache_min_tokens
    if tokens < minimum:
        return google_error(
            400,
            f"Cached content is too small. total_token_count={tokens}, "
            f"min_total_token_count={minimum}",
        )
    name = f"cachedContents/{uuid.uuid4().hex[:16]}"
    shown = str(body.get("displayName") or "")
    cache = _Cache(name, model, inputs, tokens, now, now, expires, shown)
    state.caches[name] = cache
    state.hooks.log(kind="gemini_cache_create", name=name, tokens=tokens)
    return web.json_response(cache.public())


def _cache_name(request: web.Request) -> str:
    return f"cachedContents/{request.match_info['cache_id']}"


def _unknown(name: str) -> web.Response:
    return google_error(404, f"CachedContent not found (or permission denied): {name}")


async def _get_cache(request: web.Request) -> web.Response:
    if not _has_key(request):
        return google_error(401, _NO_KEY)
    name = _cache_name(request)
    cache = request.app[_GEMINI].live(name)
    return _unknown(name) if cache is None else web.json_response(cache.public())


async def _patch_cache(request: web.Request) -> web.Response:
    if not _has_key(request):
        return google_error(401, _NO_KEY)
    name = _cache_name(request)
    cache = request.app[_GEMINI].live(name)
    if cache is None:
        return _unknown(name)
    body = await _json(request)
    if body is None:
        return google_error(400, "The request body is not a JSON object.")
    now = time.time()
    expires = _ttl(body, now)
    if isinstance(expires, str):
        return google_error(400, expires)
    cache.expires, cache.updated = expires, now
    return web.json_response(cache.public())


async def _delete_cache(request: web.Request) -> web.Response:
    if not _has_key(request):
        return google_error(401, _NO_KEY)
    name = _cache_name(request)
    state = request.app[_GEMINI]
    if state.live(name) is None:
        return _unknown(name)
    del state.caches[name]
    state.hooks.log(kind="gemini_cache_delete", name=name)
    return web.json_response({})


# -- generateContent --------------------------------------------------------------------
async def _model_call(request: web.Request) -> web.StreamResponse:
    model, _, method = request.match_info["call"].rpartition(":")
    state = request.app[_GEMINI]
    if method == "generateContent" and model:
        return await _generate(request, model)
    handler = state.methods.get(method)
    if handler is None or not model:
        return google_error(404, f"Method not found: {request.match_info['call']}")
    return await handler(request, model)


def _chat_error(response: web.StreamResponse) -> web.Response:
    """The chat core's error (OpenAI's shape) in Google's, a 429's wait as RetryInfo."""
    status = response.status
    text = response.text if isinstance(response, web.Response) else None
    try:
        message = json.loads(text or "{}").get("error", {}).get("message") or ""
    except (ValueError, AttributeError):
        message = text or ""
    delay = None
    if status == 429:
        ms = response.headers.get("retry-after-ms")
        seconds = response.headers.get("Retry-After")
        delay = float(ms) / 1000 if ms else float(seconds) if seconds else 1.0
        message = message.replace("Rate limit reached for requests", "Resource has been exhausted")
    return google_error(status, message or f"HTTP {status}", retry_delay_s=delay)


async def _generate(request: web.Request, model: str) -> web.StreamResponse:
    state = request.app[_GEMINI]
    if not _has_key(request):
        return google_error(401, _NO_KEY)
    body = await _json(request)
    if body is None:
        return google_error(400, "Invalid JSON payload received.")
    cached_tokens = 0
    name = body.get("cachedContent")
    if name is not None:
        cache = state.live(str(name))
        if cache is None:
            return _unknown(str(name))
        if any(k in body for k in ("systemInstruction", "tools", "toolConfig")):
            return google_error(
                400,
                "CachedContent can not be used with GenerateContent request setting "
                "system_instruction, tools or tool_config.",
            )
        if cache.model.removeprefix("models/") != model.removeprefix("models/"):
            return google_error(400, f"Model {model} does not match the cache's {cache.model}.")
        contents = list(cache.inputs.get("contents") or []) + list(body.get("contents") or [])
        body = {**cache.inputs, **body, "contents": contents}
        cached_tokens = cache.tokens
    try:
        chat = chat_payload(body, model)
    except ValueError as exc:
        return google_error(400, f"Invalid request: {exc}")
    response = await state.serve(request, json.dumps(chat).encode())
    if response.status != 200 or not isinstance(response, web.Response):
        return _chat_error(response)
    thinks, shown = _thinking(body)
    answer = response_from_chat(
        json.loads(response.text or "{}"),
        thoughts=thinks,
        thought_text=_THOUGHT if shown else None,
        cached_tokens=cached_tokens,
    )
    return web.json_response(answer)


def add_routes(app: web.Application, hooks: BatchHooks, serve: ServeChat) -> None:
    """Serve the Gemini API on ``app`` (built by ``app.build_app``, which passes its
    ``serve_chat``: this module cannot import the app that imports it)."""
    app[_GEMINI] = _Gemini(hooks, serve)
    for version in VERSIONS:
        app.router.add_post(f"/{version}/models/{{call}}", _model_call)
        app.router.add_post(f"/{version}/cachedContents", _create_cache)
        app.router.add_get(f"/{version}/cachedContents/{{cache_id}}", _get_cache)
        app.router.add_patch(f"/{version}/cachedContents/{{cache_id}}", _patch_cache)
        app.router.add_delete(f"/{version}/cachedContents/{{cache_id}}", _delete_cache)
