"""The ``anthropic`` backend: the Messages wire shape both ways (the documented response
shapes in ``tests/fixtures/providers/anthropic``), the sampling the pinned API version
takes, rate-limit headers, errors, and both transports against the dev server."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from factory import errors
from factory.errors import ConfigError, LLMBadRequest, LLMRateLimited
from factory.llm.backends import get_backend
from factory.llm.backends.anthropic import (
    ANTHROPIC_CACHE,
    DEFAULT_MAX_TOKENS,
    THINKING_BUDGETS,
    AnthropicOptions,
    anthropic_params,
    build,
    completion_from_anthropic,
    messages_body,
    rate_limits_from_headers,
)
from factory.llm.backends.base import BackendSetup
from factory.llm.errormap import HTTPStatusFailure, translate_error
from factory.llm.types import Message, Request, Tool, ToolCall
from factory.recipe.llm import LLMConfig
from factory.secrets import clear_secrets, register_secret
from tests.conftest import ROOT

FIXTURES = ROOT / "tests/fixtures/providers/anthropic"
POLICY = "Follow the airline policy. " * 400  # above the 1,024-token cache minimum


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def names(prefix: str = "") -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json") if p.stem.startswith(prefix))


# -- requests ---------------------------------------------------------------------------
def test_system_developer_tools_tool_use_and_merged_tool_results() -> None:
    request = Request(
        "r",
        (
            Message("system", POLICY),
            Message("developer", "Answer in JSON."),
            Message("user", "Change my flight."),
            Message(
                "assistant",
                "Looking it up.",
                (ToolCall("c1", "get_user", '{"user_id": "u1"}'), ToolCall("c2", "think", "")),
            ),
            Message("tool", '{"name": "Ann"}', tool_call_id="c1"),
            Message("tool", "ok", tool_call_id="c2"),
            Message("user", "Go on."),
        ),
        tools=(Tool("get_user", "Read a user.", {"type": "object", "properties": {}}),),
        static_prefix=1,
    )
    body = messages_body(request, "claude-sonnet-4-5", {"max_tokens": 100})
    assert list(body) == ["model", "tools", "system", "messages", "max_tokens"]  # cache order
    assert body["tools"] == [
        {
            "name": "get_user",
            "input_schema": {"type": "object", "properties": {}},
            "description": "Read a user.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    # the static block (the first system message) is marked; the developer message is not
    assert body["system"] == [
        {"type": "text", "text": POLICY, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in JSON."},
    ]
    user, assistant, results = body["messages"]
    assert user == {"role": "user", "content": "Change my flight."}
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        {"type": "text", "text": "Looking it up."},
        {"type": "tool_use", "id": "c1", "name": "get_user", "input": {"user_id": "u1"}},
        {"type": "tool_use", "id": "c2", "name": "think", "input": {}},
    ]
    # consecutive tool results (and the user text after them) are one user turn
    assert results == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": '{"name": "Ann"}'},
            {"type": "tool_result", "tool_use_id": "c2", "content": "ok"},
            {"type": "text", "text": "Go on."},
        ],
    }


def test_no_static_prefix_no_marks_and_a_static_user_turn_is_marked_last() -> None:
    plain = Request.of("r", [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert "cache_control" not in json.dumps(messages_body(plain, "m", {}))
    deep = Request.of(
        "r",
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "static example"},
            {"role": "user", "content": "the row"},
        ],
        static_prefix=2,
    )
    body = messages_body(deep, "m", {})
    assert body["system"] == [{"type": "text", "text": "S"}]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "static example", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "the row"},
            ],
        }
    ]


def test_a_tool_call_whose_arguments_are_not_an_object_is_a_bad_request() -> None:
    request = Request(
        "r", (Message("user", "x"), Message("assistant", "", (ToolCall("c", "f", "[1]"),)))
    )
    with pytest.raises(LLMBadRequest, match="not a JSON object"):
        messages_body(request, "m", {})


# -- answers ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in names() if not n.startswith(("error_", "ratelimit_"))])
def test_documented_responses_map_to_the_neutral_completion(name: str) -> None:
    case = fixture(name)
    completion = completion_from_anthropic(case["body"], "ep", "asked-model")
    expect = case["expect"]
    assert completion.text == expect["text"]
    assert completion.reasoning == expect["reasoning"]
    assert completion.finish_reason == expect["finish_reason"]
    assert completion.usage.as_dict() == expect["usage"]
    assert completion.model == case["body"]["model"]
    calls = [
        {"id": c.id, "name": c.name, "arguments": json.loads(c.arguments)}
        for c in completion.tool_calls
    ]
    assert calls == expect["tool_calls"]
    # the neutral convention: input is every input token, cache reads and writes parts of it
    u = completion.usage
    assert u.input == u.uncached_input + u.cached_input + u.cache_write


@pytest.mark.parametrize("name", names("error_"))
def test_documented_errors_map_through_the_one_error_map(name: str) -> None:
    case = fixture(name)
    failure = HTTPStatusFailure(case["status"], json.dumps(case["body"]).encode(), case["headers"])
    err = translate_error(failure, "ep")
    expect = case["expect"]
    assert type(err).__name__ == expect["error"] and err.retryable is expect["retryable"]
    assert case["body"]["error"]["message"][:40] in str(err)
    if expect["retry_after"] is not None:
        assert isinstance(err, LLMRateLimited) and err.retry_after == expect["retry_after"]
    assert getattr(errors, expect["error"]) is type(err)


def test_a_key_echoed_in_an_error_is_redacted() -> None:
    secret = "sk-ant-api03-" + "x" * 40
    register_secret(secret)
    try:
        body = {"type": "error", "error": {"type": "authentication_error",
                                           "message": f"invalid x-api-key {secret}"}}  # fmt: skip
        err = translate_error(HTTPStatusFailure(401, json.dumps(body).encode(), {}), "ep")
        assert err is not None and secret[:16] not in str(err) and "invalid x-api-key" in str(err)
    finally:
        clear_secrets()


def test_a_body_that_is_not_a_message_is_a_server_error() -> None:
    with pytest.raises(errors.LLMServerError, match="no content"):
        completion_from_anthropic({"type": "error"}, "ep", "m")


def test_ratelimit_headers() -> None:
    case = fixture("ratelimit_headers")
    now = datetime.fromisoformat(case["now"].replace("Z", "+00:00"))
    limits = rate_limits_from_headers(case["headers"], now=now)
    assert limits is not None
    for key, value in case["expect"].items():
        assert getattr(limits, key) == pytest.approx(value), key
    only_input = {k: v for k, v in case["headers"].items() if "-input-tokens-" in k}
    limits = rate_limits_from_headers(only_input, now=now)
    assert limits is not None and limits.tokens_remaining == 1998800
    assert limits.requests_remaining is None
    assert rate_limits_from_headers({"request-id": "x"}) is None
    past = {"anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2000-01-01T00:00:00Z"}  # fmt: skip
    limits = rate_limits_from_headers(past, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert limits is not None and limits.requests_reset_s == 0.0


# -- sampling ---------------------------------------------------------------------------
def test_max_tokens_is_always_sent() -> None:
    assert anthropic_params("m", {}) == {"max_tokens": DEFAULT_MAX_TOKENS}
    assert anthropic_params("m", {"max_completion_tokens": 900})["max_tokens"] == 900


def test_2023_06_01_takes_temperature_and_top_p() -> None:
    params = anthropic_params("m", {"temperature": 0.7, "top_p": 0.9, "max_tokens": 500})
    assert params == {"max_tokens": 500, "temperature": 0.7, "top_p": 0.9}
    with pytest.raises(ConfigError) as caught:
        anthropic_params("m", {"temperature": 1.5})
    assert caught.value.key_path == "llm.sampling.temperature"


def test_2026_10_21_takes_no_sampling_knob() -> None:
    v2 = {"api_version": "2026-10-21"}
    assert anthropic_params("m", {"temperature": 1.0, "top_p": 1.0}, **v2) == {
        "max_tokens": DEFAULT_MAX_TOKENS
    }  # 1.0 is the model's default: left out
    for key in ("temperature", "top_p"):
        with pytest.raises(ConfigError, match="takes no") as caught:
            anthropic_params("m", {key: 0.7}, **v2)
        assert caught.value.key_path == f"llm.sampling.{key}"


def test_reasoning_effort_turns_thinking_on_within_max_tokens() -> None:
    params = anthropic_params("claude-opus-4-1", {"reasoning_effort": "high"})
    budget = THINKING_BUDGETS["high"]
    assert params["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert params["max_tokens"] > budget
    assert anthropic_params("m", {}, thinking_budget=3000)["thinking"]["budget_tokens"] == 3000
    with pytest.raises(ConfigError, match="less than max_tokens") as caught:
        anthropic_params("m", {"reasoning_effort": "medium", "max_tokens": 4000})
    assert caught.value.key_path == "llm.sampling.max_tokens"
    with pytest.raises(ConfigError, match="only temperature 1") as caught:
        anthropic_params("m", {"reasoning_effort": "low", "temperature": 0.5})
    assert caught.value.key_path == "llm.sampling.temperature"
    assert anthropic_params("m", {"reasoning_effort": "low", "temperature": 1})["temperature"] == 1


def test_seed_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert "seed" not in anthropic_params("seed-model", {"seed": 3})
        anthropic_params("seed-model", {"seed": 4})
    assert sum("seed dropped" in r.getMessage() for r in caplog.records) == 1


def test_unknown_keys_and_versions_are_config_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        anthropic_params("m", {"top_k": 5})
    assert caught.value.key_path == "llm.sampling.top_k"
    with pytest.raises(ConfigError):
        anthropic_params("m", {}, api_version="2024-01-01")


# -- the backend ------------------------------------------------------------------------
def test_the_plugin_is_found_with_its_cache_terms() -> None:
    plugin = get_backend("anthropic")
    assert plugin.options is AnthropicOptions and plugin.cache is ANTHROPIC_CACHE
    assert plugin.cache.marked and plugin.cache.min_tokens == 1024


def _setup(url: str | None, *, model: str = "factory-dev", **options: Any) -> BackendSetup:
    """A backend's setup (the devserver's model: the SDK warns about a real model name's
    deprecation date, and the suite turns warnings into errors)."""
    llm: dict[str, Any] = {
        "model": model,
        "sampling": options.pop("sampling", {"temperature": 0.7, "max_tokens": 2000}),
        "retry": {"max_attempts": 2, "base_delay_s": 0.01, "max_delay_s": 0.05},
        "timeout_s": 10,
    }
    if url is not None:
        llm["endpoints"] = [{"base_url": url}]
    return BackendSetup(
        llm=LLMConfig(**llm),
        model=model,
        options=AnthropicOptions(**options),
        concurrency=4,
        price=None,
    )


def test_default_endpoint_is_anthropics_api_with_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        build(_setup(None))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-" + "k" * 30)
    backend = build(_setup(None))
    try:
        assert [e.base_url for e in backend.client.pool.endpoints] == [  # type: ignore[attr-defined]
            "https://api.anthropic.com/v1"
        ]
    finally:
        asyncio.run(backend.aclose())
        clear_secrets()


def test_a_recipe_temperature_the_version_refuses_fails_the_build() -> None:
    with pytest.raises(ConfigError) as caught:
        build(_setup("http://127.0.0.1:9/v1", api_version="2026-10-21"))
    assert caught.value.key_path == "llm.sampling.temperature"


def _prompt(row: str) -> Request:
    sampling = {"temperature": 0.7, "max_tokens": 2000}
    return Request.of(
        f"req-{row}",
        [{"role": "system", "content": POLICY}, {"role": "user", "content": row}],
        sampling=sampling,
        static_prefix=1,
    )


@pytest.mark.parametrize("client", ["http", "sdk"])
def test_both_transports_against_the_devserver(devserver: Any, client: str) -> None:
    """A marked prefix written once, then read. The SDK, whose default is ``Authorization:
    Bearer``, sends ``x-api-key`` with 2023-06-01: the devserver refuses a Bearer key with
    that version (401, not retried), as the API does."""
    server = devserver()

    async def go() -> list[Any]:
        backend = build(_setup(server.url, client=client))
        try:
            return [await backend.complete(_prompt(row)) for row in ("one", "two")]  # type: ignore[attr-defined]
        finally:
            await backend.aclose()

    first, second = asyncio.run(go())
    assert first.text.startswith("Understood") and first.finish_reason == "stop"
    assert first.usage.cache_write > 1024 and first.usage.cached_input == 0
    assert second.usage.cached_input == first.usage.cache_write and second.usage.cache_write == 0
    assert second.usage.input == second.usage.cached_input + second.usage.uncached_input
    assert first.attempts == 1 and first.rate_limits is None  # no --rpm: no budget stated


@pytest.mark.parametrize("client", ["http", "sdk"])
def test_thinking_and_the_2026_version_over_both_transports(devserver: Any, client: str) -> None:
    server = devserver()
    setup = _setup(
        server.url,
        client=client,
        api_version="2026-10-21",
        sampling={"reasoning_effort": "low", "temperature": 1.0},
    )

    async def go() -> Any:
        backend = build(setup)
        try:
            return await backend.complete(  # type: ignore[attr-defined]
                Request.of("t", [{"role": "user", "content": "hi"}], sampling=setup.llm.sampling)
            )
        finally:
            await backend.aclose()

    completion = asyncio.run(go())
    assert completion.reasoning and completion.text
    assert 0 < completion.usage.reasoning < completion.usage.output


@pytest.mark.parametrize("client", ["http", "sdk"])
def test_refusals_are_retried_and_reported_by_both_transports(devserver: Any, client: str) -> None:
    server = devserver(defects={"rate_limit": 1.0}, retry_after_s=0.01)
    secret = "sk-ant-secret-" + "s" * 30
    register_secret(secret)

    async def go() -> None:
        backend = build(_setup(server.url, client=client))
        try:
            await backend.complete(_prompt("x"))  # type: ignore[attr-defined]
        finally:
            await backend.aclose()

    try:
        with pytest.raises(LLMRateLimited) as caught:
            asyncio.run(go())
    finally:
        clear_secrets()
    err = caught.value
    assert err.attempts == 2 and err.retry_after == 1.0  # Retry-After rounds up to 1 s
    assert "rate limited" in str(err) and secret[:16] not in str(err)
