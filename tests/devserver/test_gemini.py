"""The development server's Gemini API: the translation to and from a chat body, the
routes (both versions, the key, errors in Google's shape), the context caches, and the
``gemini`` backend's explicit cache against it (made once, counted, deleted)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from factory.devserver.gemini import chat_payload, normalize, response_from_chat
from factory.llm.backends import build_backend
from factory.llm.backends.gemini import completion_from_gemini, generate_body
from factory.llm.pricing import Price, cost
from factory.llm.types import Message, Request, ToolCall
from factory.recipe import LLMConfig

POLICY = "Airline policy: " + "be exact about fares and dates. " * 400  # ~3,200 tokens


def _post(url: str, body: Any, *, key: str | None = "k", method: str = "POST") -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["x-goog-api-key"] = key
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _root(server: Any) -> str:
    return server.url.rsplit("/v1", 1)[0]


def test_a_request_translates_to_a_chat_body_and_back() -> None:
    call = ToolCall("call_x", "search", '{"q": "flights"}')
    request = Request(
        "r",
        (
            Message("system", "SYS"),
            Message("user", "find"),
            Message("assistant", "", (call,)),
            Message("tool", '{"n": 2}', tool_call_id="call_x"),
        ),
    )
    body = generate_body(request, "m", {"maxOutputTokens": 64, "topP": 0.5})
    chat = chat_payload(body, "models/gemini-2.5-flash")
    assert chat["model"] == "gemini-2.5-flash"
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    made = chat["messages"][2]["tool_calls"][0]
    assert made["function"]["name"] == "search" and json.loads(made["function"]["arguments"]) == {
        "q": "flights"
    }
    assert chat["messages"][3]["tool_call_id"] == made["id"]  # answered by the call's name
    assert chat["max_tokens"] == 64 and chat["top_p"] == 0.5
    answer = {
        "id": "chatcmpl-1",
        "model": "gemini-2.5-flash",
        "choices": [{"message": {"content": "done"}, "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 40},
        },
    }
    response = response_from_chat(answer, thoughts=True, thought_text="why", cached_tokens=90)
    c = completion_from_gemini(response, "dev", "m")
    assert c.text == "done" and c.reasoning == "why" and c.finish_reason == "length"
    meta = response["usageMetadata"]
    assert c.usage.cached_input == 90 and c.usage.input == 100
    assert c.usage.output == 7 + meta["thoughtsTokenCount"] and c.usage.reasoning > 0
    assert meta["totalTokenCount"] == 100 + c.usage.output


def test_snake_case_fields_are_read_but_user_data_keeps_its_names() -> None:
    body = normalize(
        {
            "generation_config": {"thinking_config": {"include_thoughts": True}},
            "contents": [{"parts": [{"function_call": {"name": "f", "args": {"a_b": 1}}}]}],
        }
    )
    assert body["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}
    assert body["contents"][0]["parts"][0]["functionCall"]["args"] == {"a_b": 1}


def test_routes_speak_googles_shapes(devserver: Any) -> None:
    server = devserver(defects={"rate_limit": 1.0}, retry_after_s=3, gemini_cache_min_tokens=500)
    root = _root(server)
    ask = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    status, body = _post(f"{root}/v1beta/models/gemini-2.5-flash:generateContent", ask, key=None)
    assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED"
    status, body = _post(f"{root}/v1/models/gemini-2.5-flash:generateContent", ask)
    assert status == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED"
    info = body["error"]["details"][0]
    assert info["@type"].endswith("google.rpc.RetryInfo") and info["retryDelay"] == "3s"
    status, body = _post(f"{root}/v1beta/models/gemini-2.5-flash:unknownMethod", ask)
    assert status == 404
    status, body = _post(f"{root}/v1beta/models/gemini-2.5-flash:generateContent", {"x": 1})
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    # caches: too small, unknown, and one named with a system instruction of its own
    small = {"model": "models/gemini-2.5-flash", "systemInstruction": {"parts": [{"text": "x"}]}}
    status, body = _post(f"{root}/v1beta/cachedContents", small)
    assert status == 400 and "too small" in body["error"]["message"]
    big = {**small, "systemInstruction": {"parts": [{"text": POLICY}]}, "ttl": "60s"}
    status, made = _post(f"{root}/v1beta/cachedContents", big)
    assert status == 200 and made["name"].startswith("cachedContents/")
    assert made["usageMetadata"]["totalTokenCount"] > 500 and "systemInstruction" not in made
    status, got = _post(f"{root}/v1beta/{made['name']}", None, method="GET")
    assert status == 200 and got["expireTime"] == made["expireTime"]
    status, patched = _post(f"{root}/v1beta/{made['name']}", {"ttl": "7200s"}, method="PATCH")
    assert status == 200 and patched["expireTime"] > made["expireTime"]
    both = {**ask, "cachedContent": made["name"], "systemInstruction": {"parts": [{"text": "y"}]}}
    status, body = _post(f"{root}/v1beta/models/gemini-2.5-flash:generateContent", both)
    assert status == 400 and "CachedContent can not be used" in body["error"]["message"]
    assert _post(f"{root}/v1beta/{made['name']}", None, method="DELETE")[0] == 200
    gone = {**ask, "cachedContent": made["name"]}
    status, body = _post(f"{root}/v1beta/models/gemini-2.5-flash:generateContent", gone)
    assert status == 404 and body["error"]["status"] == "NOT_FOUND"


PRICE = Price(input_per_mtok=0.30, cached_input_per_mtok=0.03, output_per_mtok=2.50)


def _backend(url: str, **options: Any) -> Any:
    llm = LLMConfig.model_validate(
        {
            "backend": "gemini",
            "model": "gemini-2.5-flash",
            "endpoints": [{"base_url": url}],
            "sampling": {"reasoning_effort": "low"},
            "backend_options": options,
        }
    )
    return build_backend(llm, "gemini-2.5-flash", concurrency=4, price=PRICE)


def _requests(n: int) -> list[Request]:
    return [
        Request.of(
            f"r{i}",
            [{"role": "system", "content": POLICY}, {"role": "user", "content": f"question {i}"}],
            static_prefix=1,
        )
        for i in range(n)
    ]


def test_the_explicit_cache_is_made_once_counted_and_deleted(
    devserver: Any, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(request_log=str(log), gemini_cache_min_tokens=1024)

    async def go() -> list[Any]:
        backend = _backend(
            server.url,
            explicit_cache="on",
            cache_storage_per_mtok_hour=1.0,
            explicit_cache_ttl_s=300,
        )
        try:
            return [c async for c in backend.run(_requests(6))]
        finally:
            await backend.aclose()

    results = asyncio.run(go())
    completions = [r.completion for r in results]
    assert all(c is not None and c.reasoning for c in completions)
    events = [json.loads(x) for x in log.read_text().splitlines()]
    made = [e for e in events if e.get("kind") == "gemini_cache_create"]
    deleted = [e for e in events if e.get("kind") == "gemini_cache_delete"]
    assert len(made) == 1 and [e["name"] for e in deleted] == [made[0]["name"]]
    tokens = made[0]["tokens"]
    assert all(c.usage.cached_input >= min(tokens, c.usage.input) > 3000 for c in completions)
    # the cache's making (input rate) and one TTL of storage ride on the completions' cost
    charged = tokens * 0.30 / 1e6 + tokens * 1.0 * (300 / 3600) / 1e6
    extra = sum(c.cost_usd - cost(c.usage, PRICE) for c in completions)
    assert extra == pytest.approx(charged, rel=1e-9)
    # the requests named the cache: none carried the policy inline
    status, _ = _post(f"{_root(server)}/v1beta/{made[0]['name']}", None, method="GET")
    assert status == 404


def test_auto_without_a_storage_price_stays_implicit(devserver: Any, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(request_log=str(log))

    async def go() -> list[Any]:
        backend = _backend(server.url, cache_decide_after_s=0, client="sdk")
        try:
            return [r.completion async for r in backend.run(_requests(3))]
        finally:
            await backend.aclose()

    completions = asyncio.run(go())
    assert all(
        c is not None and c.cost_usd == pytest.approx(cost(c.usage, PRICE)) for c in completions
    )
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert not [e for e in events if e.get("kind") == "gemini_cache_create"]
    # the chat core's prefix cache: a later request reports the policy cached
    assert max(c.usage.cached_input for c in completions) > 3000
