"""The ``gemini`` backend: Google's documented response shapes (tests/fixtures/providers/
gemini) mapped to the neutral types, the request body, sampling, errors, the explicit
cache's decision and life, and the key kept out of URLs and messages."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from factory.errors import ConfigError, LLMBadRequest, LLMRateLimited, LLMServerError
from factory.llm.backends import build_backend
from factory.llm.backends.gemini import (
    completion_from_gemini,
    endpoint_url,
    gemini_error,
    gemini_params,
    generate_body,
    retry_delay_s,
    usage_from_gemini,
)
from factory.llm.backends.gemini_cache import min_cache_tokens
from factory.llm.pricing import Price, explicit_cache_pays
from factory.llm.types import Message, Request, Tool, ToolCall, Usage
from factory.recipe import LLMConfig

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "providers" / "gemini"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


# -- answers ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "finish", "usage"),
    [
        ("text", "AI learns patterns", "stop", Usage(input=8, output=12)),
        ("function_call", "", "tool_calls", Usage(input=120, output=41 + 69, reasoning=69)),
        (
            "thoughts",
            "Alice owns the cat",
            "stop",
            Usage(input=52, output=15 + 1067, reasoning=1067),
        ),
        (
            "cached_usage",
            "The transcript",
            "stop",
            Usage(input=323383, cached_input=323374, output=17),
        ),
        ("max_tokens", "Once upon a time", "length", Usage(input=9, output=10 + 41, reasoning=41)),
        ("safety", "", "content_filter", Usage(input=14)),
        ("blocked_prompt", "", "content_filter", Usage(input=11)),
    ],
)
def test_documented_answers_map_to_the_neutral_completion(
    name: str, text: str, finish: str, usage: Usage
) -> None:
    body = fixture(name)
    c = completion_from_gemini(body, "gemini", "asked-model")
    assert c.text.startswith(text) and (text or c.text == "")
    assert c.finish_reason == finish
    assert c.usage == usage
    assert c.model == body["modelVersion"]
    assert c.usage.uncached_input == usage.input - usage.cached_input


def test_thought_parts_are_the_reasoning_not_the_text() -> None:
    c = completion_from_gemini(fixture("thoughts"), "gemini", "m")
    assert c.reasoning is not None and c.reasoning.startswith("**Analyzing the puzzle**")
    assert "Analyzing" not in c.text
    assert completion_from_gemini(fixture("text"), "gemini", "m").reasoning is None


def test_function_calls_get_stable_distinct_ids_and_json_arguments() -> None:
    body = fixture("function_call")
    first = completion_from_gemini(body, "gemini", "m").tool_calls
    again = completion_from_gemini(json.loads(json.dumps(body)), "gemini", "m").tool_calls
    assert [c.name for c in first] == ["schedule_meeting", "get_current_temperature"]
    assert json.loads(first[1].arguments) == {"location": "London"}
    assert len({c.id for c in first}) == 2 and all(c.id for c in first)
    assert first == again  # a replayed answer keeps its ids
    with_id = {
        "candidates": [
            {
                "content": {"parts": [{"functionCall": {"id": "fc-1", "name": "f", "args": {}}}]},
                "finishReason": "STOP",
            }
        ]
    }
    assert completion_from_gemini(with_id, "g", "m").tool_calls[0].id == "fc-1"


def test_an_answer_without_candidates_or_reason_is_a_server_error() -> None:
    with pytest.raises(LLMServerError, match="no candidates"):
        completion_from_gemini({"usageMetadata": {}}, "gemini", "m")


def test_usage_counts_tool_prompts_and_never_more_cached_than_prompt() -> None:
    u = usage_from_gemini(
        {
            "promptTokenCount": 10,
            "toolUsePromptTokenCount": 5,
            "cachedContentTokenCount": 99,
            "candidatesTokenCount": 3,
        }
    )
    assert u == Usage(input=15, cached_input=15, output=3)
    assert usage_from_gemini(None) == Usage()


# -- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind", "retry_after"),
    [
        ("error_429", LLMRateLimited, 7.0),
        ("error_400", LLMBadRequest, None),
        ("error_403_key", LLMBadRequest, None),
        ("error_503", LLMServerError, None),
    ],
)
def test_documented_errors_map_to_the_factory_errors(
    name: str, kind: type, retry_after: float | None
) -> None:
    body = fixture(name)
    err = gemini_error("gemini", body["error"]["code"], body)
    assert type(err) is kind
    assert err.status == body["error"]["code"]
    assert body["error"]["status"] in str(err)
    assert getattr(err, "retry_after", None) == retry_after
    assert err.retryable == (kind is not LLMBadRequest)


def test_retry_delay_forms() -> None:
    info = "type.googleapis.com/google.rpc.RetryInfo"
    assert retry_delay_s({"details": [{"@type": info, "retryDelay": "0.5s"}]}) == 0.5
    assert (
        retry_delay_s(
            {
                "error": {
                    "details": [{"@type": info, "retryDelay": {"seconds": 2, "nanos": 500000000}}]
                }
            }
        )
        == 2.5
    )
    assert retry_delay_s({"error": {"details": [{"@type": "other", "retryDelay": "3s"}]}}) is None
    assert retry_delay_s("not json") is None
    # without RetryInfo a Retry-After header is read
    err = gemini_error("g", 429, {"error": {"message": "x"}}, {"Retry-After": "4"})
    assert isinstance(err, LLMRateLimited) and err.retry_after == 4.0


# -- requests ---------------------------------------------------------------------------
def _conversation() -> Request:
    call = ToolCall("call_a", "get_reservation", '{"id": "R1"}')
    return Request(
        "req-1",
        (
            Message("system", "POLICY " * 50),
            Message("user", "Where is my booking?"),
            Message("assistant", "Let me look.", (call,)),
            Message("tool", '{"status": "confirmed"}', tool_call_id="call_a"),
            Message("tool", "plain text", tool_call_id="call_a"),
            Message("user", "Thanks"),
        ),
        tools=(Tool("get_reservation", "Find one", {"type": "object"}),),
        static_prefix=1,
    )


def test_generate_body_maps_roles_tools_and_function_turns() -> None:
    body = generate_body(_conversation(), "gemini-2.5-flash", {"temperature": 0.2})
    assert next(iter(body)) == "systemInstruction"  # the static block first
    assert body["systemInstruction"] == {"parts": [{"text": "POLICY " * 50}]}
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_reservation",
                    "description": "Find one",
                    "parameters": {"type": "object"},
                }
            ]
        }
    ]
    roles = [c["role"] for c in body["contents"]]
    assert roles == ["user", "model", "user", "user"] or roles == ["user", "model", "user"]
    model_turn = body["contents"][1]["parts"]
    assert model_turn[0] == {"text": "Let me look."}
    assert model_turn[1] == {"functionCall": {"name": "get_reservation", "args": {"id": "R1"}}}
    answers = body["contents"][2]["parts"]
    assert answers[0] == {
        "functionResponse": {"name": "get_reservation", "response": {"status": "confirmed"}}
    }
    assert answers[1]["functionResponse"]["response"] == {"output": "plain text"}
    assert body["generationConfig"] == {"temperature": 0.2}
    assert "model" not in body  # the model is in the path


def test_system_instruction_is_byte_identical_across_requests() -> None:
    a = generate_body(_conversation(), "m", {})
    other = Request("req-2", (Message("system", "POLICY " * 50), Message("user", "Other")))
    b = generate_body(other, "m", {})
    assert json.dumps(a["systemInstruction"]) == json.dumps(b["systemInstruction"])


def test_a_body_naming_a_cache_leaves_its_prefix_and_tools_out() -> None:
    body = generate_body(
        _conversation(), "m", {}, cached_content="cachedContents/x", cached_messages=1
    )
    assert body["cachedContent"] == "cachedContents/x"
    assert "systemInstruction" not in body and "tools" not in body
    assert body["contents"][0]["parts"] == [{"text": "Where is my booking?"}]


def test_a_tool_answer_to_an_unknown_call_is_a_bad_request() -> None:
    bad = Request("r", (Message("user", "hi"), Message("tool", "x", tool_call_id="nope")))
    with pytest.raises(LLMBadRequest, match="nope"):
        generate_body(bad, "m", {})


# -- sampling ---------------------------------------------------------------------------
def test_sampling_maps_to_generation_config() -> None:
    got = gemini_params(
        "gemini-2.5-flash",
        {"temperature": 1.0, "top_p": 0.9, "seed": 7, "max_completion_tokens": 512},
    )
    assert got == {"temperature": 1.0, "topP": 0.9, "seed": 7, "maxOutputTokens": 512}


@pytest.mark.parametrize(
    ("model", "effort", "thinking"),
    [
        ("gemini-2.5-flash", "low", {"thinkingBudget": 1024, "includeThoughts": True}),
        ("gemini-2.5-flash", "high", {"thinkingBudget": 24576, "includeThoughts": True}),
        ("gemini-2.5-flash", "minimal", {"thinkingBudget": 0}),
        ("gemini-2.5-pro", "minimal", {"thinkingBudget": 128, "includeThoughts": True}),
        ("gemini-3-pro-preview", "low", {"thinkingLevel": "low", "includeThoughts": True}),
    ],
)
def test_reasoning_effort_becomes_a_thinking_config(
    model: str, effort: str, thinking: dict[str, Any]
) -> None:
    assert gemini_params(model, {"reasoning_effort": effort})["thinkingConfig"] == thinking


def test_thinking_options_override_and_silence() -> None:
    got = gemini_params(
        "gemini-2.5-flash", {"reasoning_effort": "low"}, thinking_budget=-1, include_thoughts=False
    )
    assert got["thinkingConfig"] == {"thinkingBudget": -1}
    assert "thinkingConfig" not in gemini_params("gemini-2.5-flash", {})


@pytest.mark.parametrize(
    ("sampling", "key"),
    [({"temprature": 1}, "llm.sampling.temprature"), ({"top_p": 0}, "llm.sampling.top_p")],
)
def test_bad_sampling_names_its_key(sampling: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        gemini_params("gemini-2.5-flash", sampling)
    assert info.value.key_path == key


# -- the explicit cache's decision ------------------------------------------------------
PRICE = Price(input_per_mtok=0.30, cached_input_per_mtok=0.03, output_per_mtok=2.50)


@pytest.mark.parametrize(
    ("tokens", "calls", "storage", "pays"),
    [
        (6000, 1000, 1.0, True),  # a stage at full speed: saves far more than it stores
        (6000, 1, 1.0, False),  # one call per TTL: making the cache costs more
        (6000, 1000, None, False),  # no storage price: cannot be known to pay
        (1000, 1000, 1.0, False),  # shorter than the model caches
        (6000, 2, 0.0, True),  # free storage: the second call already pays for the first
    ],
)
def test_explicit_cache_pays_from_the_prices(
    tokens: int, calls: int, storage: float | None, pays: bool
) -> None:
    got = explicit_cache_pays(tokens, calls, PRICE, 600, storage, min_tokens=2048)
    assert got is pays


def test_explicit_cache_break_even_moves_with_storage_and_implicit_hits() -> None:
    cheap = explicit_cache_pays(6000, 5, PRICE, 600, 1.0, min_tokens=2048)
    dear = explicit_cache_pays(6000, 5, PRICE, 600, 10_000.0, min_tokens=2048)
    assert cheap and not dear
    assert not explicit_cache_pays(
        6000, 5, PRICE, 600, 1.0, min_tokens=2048, implicit_hit_share=0.9
    )
    assert not explicit_cache_pays(6000, 1000, None, 600, 1.0, min_tokens=2048)
    assert min_cache_tokens("gemini-2.5-flash") < min_cache_tokens("gemini-2.5-pro")


# -- the URL and the key ----------------------------------------------------------------
def test_endpoint_url_speaks_the_pinned_version() -> None:
    assert endpoint_url("http://127.0.0.1:8000/v1", "v1beta") == "http://127.0.0.1:8000/v1beta"
    assert endpoint_url("https://g.example/v1beta/", "v1") == "https://g.example/v1"
    assert endpoint_url("https://g.example/proxy", "v1beta") == "https://g.example/proxy/v1beta"
    with pytest.raises(ConfigError, match="x-goog-api-key") as info:
        endpoint_url("https://g.example/v1beta?key=SECRET", "v1beta")
    assert "SECRET" not in str(info.value)


class _Recorder:
    """A Gemini API stand-in on 127.0.0.1 (its own loop, in a thread): a 429 with RetryInfo
    first, then the fixtures' text answer; records each request's URL and key header."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, str | None]] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen.append((str(request.url), request.headers.get("x-goog-api-key")))
        status, body = self.answers[min(len(self.seen) - 1, len(self.answers) - 1)]
        return web.json_response(body, status=status)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture()
def recorder() -> Iterator[Any]:
    made: list[_Recorder] = []

    def make(answers: list[tuple[int, dict[str, Any]]]) -> _Recorder:
        made.append(_Recorder(answers))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def _llm(url: str, **options: Any) -> LLMConfig:
    return LLMConfig.model_validate(
        {
            "backend": "gemini",
            "model": "gemini-2.5-flash",
            "endpoints": [{"base_url": url, "api_key_env": "FACTORY_TEST_GEMINI_KEY"}],
            "retry": {"max_attempts": 3, "base_delay_s": 0.01, "max_delay_s": 60.0},
            "backend_options": options,
        }
    )


@pytest.mark.parametrize("client", ["http", "sdk"])
def test_the_key_travels_in_a_header_and_a_429_waits_as_asked(
    recorder: Any, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    key = "AIzaSy-factory-test-key-0123456789"
    monkeypatch.setenv("FACTORY_TEST_GEMINI_KEY", key)
    server = recorder([(429, fixture("error_429")), (200, fixture("text"))])
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async def go() -> Any:
        backend = build_backend(
            _llm(f"http://127.0.0.1:{server.port}/v1", client=client),
            "gemini-2.5-flash",
            concurrency=2,
            price=PRICE,
            sleep=sleep,
        )
        try:
            return await backend.complete(Request.of("r1", [{"role": "user", "content": "hi"}]))
        finally:
            await backend.aclose()

    c = asyncio.run(go())
    assert c.text.startswith("AI learns") and c.attempts == 2
    assert c.retries == {"llm_rate_limited": 1}
    assert slept and slept[0] >= 7.0  # RetryInfo's 7s
    assert [url.split(f":{server.port}", 1)[1] for url, _ in server.seen] == [
        "/v1beta/models/gemini-2.5-flash:generateContent"
    ] * 2
    assert all(key not in url and header == key for url, header in server.seen)


def test_a_refusal_never_shows_the_key(recorder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "AIzaSy-factory-test-key-abcdefghij"
    monkeypatch.setenv("FACTORY_TEST_GEMINI_KEY", key)
    echo = {
        "error": {"code": 400, "status": "INVALID_ARGUMENT", "message": f"API key not valid: {key}"}
    }
    server = recorder([(400, echo)])

    async def go() -> None:
        backend = build_backend(
            _llm(f"http://127.0.0.1:{server.port}/v1beta"),
            "gemini-2.5-flash",
            concurrency=1,
            price=None,
        )
        try:
            await backend.complete(Request.of("r1", [{"role": "user", "content": "hi"}]))
        finally:
            await backend.aclose()

    with pytest.raises(LLMBadRequest) as info:
        asyncio.run(go())
    assert key not in str(info.value) and "INVALID_ARGUMENT" in str(info.value)


def test_the_default_endpoint_is_googles_with_its_key_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    llm = LLMConfig.model_validate({"backend": "gemini", "model": "gemini-2.5-flash"})
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        build_backend(llm, "gemini-2.5-flash", concurrency=1, price=None)
    monkeypatch.setenv("GOOGLE_API_KEY", "k")
    backend = build_backend(llm, "gemini-2.5-flash", concurrency=1, price=None)
    transport = next(iter(backend.client._clients.values()))  # type: ignore[attr-defined]
    assert transport.base == "https://generativelanguage.googleapis.com/v1beta"
