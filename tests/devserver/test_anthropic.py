"""The dev server's Anthropic Messages API (``POST /v1/messages``): the translation to and
from a chat body, the version and key rules, marked-prefix caching, thinking, errors in
Anthropic's shape and its rate-limit headers (in-process server in a thread)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from factory.devserver import DevServer, DevServerConfig
from factory.devserver.anthropic import (
    MarkedCache,
    anthropic_headers,
    chat_payload,
    marked_prefix,
    message_from_chat,
    parse_duration,
)
from factory.llm.backends.anthropic import rate_limits_from_headers

POLICY = "Follow the airline policy. " * 400  # ~2,700 tokens: above the 1,024 minimum
MARK = {"type": "ephemeral"}
V1, V2 = "2023-06-01", "2026-10-21"


def body(**over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": "factory-dev",
        "max_tokens": 1000,
        "system": [{"type": "text", "text": POLICY, "cache_control": MARK}],
        "messages": [{"role": "user", "content": "hello there"}],
    }
    out.update(over)
    return out


def post(
    server: DevServer, payload: Any, *, version: str | None = V1, key: str | None = "k",
    bearer: str | None = None,
) -> tuple[int, dict[str, str], Any]:  # fmt: skip
    req = urllib.request.Request(
        server.url + "/messages", data=json.dumps(payload).encode(), method="POST"
    )
    req.add_header("content-type", "application/json")
    if version is not None:
        req.add_header("anthropic-version", version)
    if key is not None:
        req.add_header("x-api-key", key)
    if bearer is not None:
        req.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    with DevServer(DevServerConfig()) as s:
        yield s


# -- the translation (pure) -------------------------------------------------------------
def test_chat_payload_maps_system_tools_tool_use_and_results() -> None:
    anthropic_body = {
        "model": "m",
        "max_tokens": 50,
        "temperature": 0.5,
        "tools": [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}],
        "messages": [
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "looking"},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": 1}},
                {"type": "tool_use", "id": "t2", "name": "lookup", "input": {"q": 2}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "t2",
                 "content": [{"type": "text", "text": "two"}]},
                {"type": "text", "text": "and now?"},
            ]},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }  # fmt: skip
    chat = chat_payload(anthropic_body)
    assert [m["role"] for m in chat["messages"]] == [
        "system", "system", "user", "assistant", "tool", "tool", "user"
    ]  # fmt: skip
    assistant = chat["messages"][3]
    assert assistant["content"] == "looking"
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        {"q": 1}, {"q": 2}
    ]  # fmt: skip
    assert [(m["tool_call_id"], m["content"]) for m in chat["messages"][4:6]] == [
        ("t1", "one"), ("t2", "two")
    ]  # fmt: skip
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert chat["max_tokens"] == 50 and chat["temperature"] == 0.5
    assert "thinking" not in chat


def test_message_from_chat_splits_input_by_cache_and_maps_stop_reasons() -> None:
    chat = {
        "id": "chatcmpl-abc",
        "model": "m",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 0},
        },
    }
    message = message_from_chat(chat)
    assert message["type"] == "message" and message["id"] == "msg_abc"
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]
    usage = message["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (40, 60)
    assert usage["cache_creation_input_tokens"] == 0 and usage["output_tokens"] == 7
    chat["choices"][0]["finish_reason"] = "length"
    assert message_from_chat(chat)["stop_reason"] == "max_tokens"


def test_marked_prefix_follows_tools_system_messages_and_ignores_the_marks() -> None:
    assert marked_prefix(body(system=[{"type": "text", "text": POLICY}])) is None
    a = marked_prefix(body())
    b = marked_prefix(body(messages=[{"role": "user", "content": "something else"}]))
    assert a is not None and b is not None and a == b  # the suffix is not in the prefix
    tools = [{"name": "t", "input_schema": {"type": "object"}, "cache_control": MARK}]
    with_tools = marked_prefix(body(tools=tools))
    assert with_tools is not None and with_tools[1] > a[1]  # tools come first
    unmarked_tool = [{"name": "t", "input_schema": {"type": "object"}}]
    c = marked_prefix(body(tools=unmarked_tool))
    assert c is not None and c[0] != a[0]  # a tool before the system mark is in the prefix


def test_marked_cache_writes_reads_and_expires() -> None:
    cache = MarkedCache(ttl_s=300.0, min_tokens=1024)
    first = cache.lookup("m", body(), now=0.0)
    assert first is not None and first[2] is False  # a write
    cache.use(first[0], 0.0)
    again = cache.lookup("m", body(), now=200.0)
    assert again is not None and again[2] is True  # a read refreshes the TTL
    cache.use(again[0], 200.0)
    assert cache.lookup("m", body(), now=450.0)[2] is True  # type: ignore[index]
    assert cache.lookup("m", body(), now=800.0)[2] is False  # type: ignore[index]
    assert cache.lookup("other-model", body(), now=450.0)[2] is False  # type: ignore[index]
    short = body(system=[{"type": "text", "text": "tiny", "cache_control": MARK}])
    assert cache.lookup("m", short, now=0.0) is None  # under 1,024 tokens: not cached


def test_ratelimit_headers_are_translated_and_read_back() -> None:
    now = datetime(2026, 10, 21, 12, 0, 0, tzinfo=UTC)
    openai_headers = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "200000",
        "x-ratelimit-remaining-tokens": "150000",
        "x-ratelimit-reset-tokens": "6m0s",
        "Retry-After": "2",
        "X-Other": "not the API's",
    }
    out = anthropic_headers(openai_headers, now=now)
    assert out["anthropic-ratelimit-requests-limit"] == "600"
    assert out["anthropic-ratelimit-requests-reset"] == "2026-10-21T12:00:00Z"  # 0.1 s later
    assert out["anthropic-ratelimit-tokens-reset"] == "2026-10-21T12:06:00Z"
    assert out["anthropic-ratelimit-input-tokens-remaining"] == "150000"
    assert out["retry-after"] == "2" and not any("other" in k for k in out)
    limits = rate_limits_from_headers(out, now=now)
    assert limits is not None
    assert (limits.requests_remaining, limits.tokens_remaining) == (599, 150000)
    assert limits.tokens_reset_s == 360.0
    assert anthropic_headers({"content-type": "application/json"}) == {}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("59.5ms", 0.0595), ("1h2m3.5s", 3723.5), ("bad", None),
     ("5x", None), ("", None)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float | None) -> None:
    got = parse_duration(text)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


# -- over HTTP --------------------------------------------------------------------------
def test_a_marked_prefix_is_written_once_then_read(server: DevServer) -> None:
    model = "cache-test-model"  # a prefix of its own in the module's server
    status, headers, first = post(server, body(model=model))
    assert status == 200 and first["type"] == "message"
    assert headers["request-id"].startswith("req_")
    _, _, second = post(server, body(model=model, messages=[{"role": "user", "content": "hi"}]))
    u1, u2 = first["usage"], second["usage"]
    assert u1["cache_creation_input_tokens"] > 1024 and u1["cache_read_input_tokens"] == 0
    assert u2["cache_read_input_tokens"] == u1["cache_creation_input_tokens"]
    assert u2["cache_creation_input_tokens"] == 0 and u2["input_tokens"] < 50
    # unmarked: Anthropic caches nothing by itself, however often the prefix repeats
    plain = body(model=model, system=[{"type": "text", "text": POLICY}])
    for _ in range(2):
        _, _, answer = post(server, plain)
        usage = answer["usage"]
        assert usage["cache_read_input_tokens"] == usage["cache_creation_input_tokens"] == 0
        assert usage["input_tokens"] > 1024


def test_thinking_comes_first_with_a_signature(server: DevServer) -> None:
    status, _, message = post(
        server, body(max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 2048})
    )
    assert status == 200
    kinds = [b["type"] for b in message["content"]]
    assert kinds == ["thinking", "text"] and message["content"][0]["signature"]
    thinking = message["usage"]["output_tokens_details"]["thinking_tokens"]
    assert 0 < thinking < message["usage"]["output_tokens"]
    status, _, err = post(
        server, body(max_tokens=1000, thinking={"type": "enabled", "budget_tokens": 2048})
    )
    assert status == 400 and err["error"]["type"] == "invalid_request_error"
    status, _, err = post(
        server,
        body(max_tokens=4000, temperature=0.5, thinking={"type": "enabled", "budget_tokens": 2048}),
    )
    assert status == 400 and "temperature" in err["error"]["message"]


def test_the_version_decides_what_sampling_it_takes(server: DevServer) -> None:
    assert post(server, body(temperature=0.7, top_p=0.9, top_k=5), version=V1)[0] == 200
    assert post(server, body(), version=V2)[0] == 200
    for key, value in (("temperature", 1.0), ("top_p", 0.9), ("top_k", 5)):
        status, _, err = post(server, body(**{key: value}), version=V2)
        assert status == 400, key
        assert err == {"type": "error", "error": {"type": "invalid_request_error",
                                                  "message": err["error"]["message"]}}  # fmt: skip
        assert key in err["error"]["message"]
    status, _, err = post(server, body(), version=None)
    assert status == 400 and "anthropic-version" in err["error"]["message"]
    assert post(server, body(), version="2020-01-01")[0] == 400


def test_the_key_header_is_required(server: DevServer) -> None:
    status, _, err = post(server, body(), key=None)
    assert status == 401 and err["error"]["type"] == "authentication_error"
    assert post(server, body(), key=None, bearer="k", version=V2)[0] == 200
    assert post(server, body(), key=None, bearer="k", version=V1)[0] == 401


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (body(messages=[]), "messages"),
        (body(messages=[{"role": "system", "content": "x"}]), "system"),
        (body(temperature=1.5), "temperature"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_requests_are_invalid_request_errors(
    server: DevServer, payload: Any, where: str
) -> None:
    status, _, err = post(server, payload)
    assert status == 400 and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error" and where in err["error"]["message"]


@pytest.mark.parametrize(
    ("defect", "overloaded", "status", "kind"),
    [
        ("rate_limit", False, 429, "rate_limit_error"),
        ("server_error", False, 500, "api_error"),
        ("server_error", True, 529, "overloaded_error"),
    ],
)
def test_defects_answer_in_anthropics_error_shape(
    devserver: Any, defect: str, overloaded: bool, status: int, kind: str
) -> None:
    server = devserver(defects={defect: 1.0}, retry_after_s=3, anthropic_overloaded=overloaded)
    got, headers, err = post(server, body())
    assert got == status and err["type"] == "error" and err["error"]["type"] == kind
    if status == 429:
        assert headers["retry-after"] == "3"
