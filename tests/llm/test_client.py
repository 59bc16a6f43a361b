"""LLMClient against a real local HTTP server, spoken to by the real openai SDK.

``ScriptedServer`` is a small aiohttp app on 127.0.0.1 (port 0, own thread and
loop) that answers ``POST /v1/chat/completions`` with replies taken from a
queue and records every request it got (headers and JSON body).
"""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from factory import secrets
from factory.errors import (
    ConfigError,
    LLMBadRequest,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
)
from factory.llm.backends.aiohttp import aiohttp_transport
from factory.llm.backends.openai import SDKTransport, sdk_transport
from factory.llm.backends.openai_wire import usage_from_openai
from factory.llm.client import LLMClient
from factory.llm.pool import CircuitState, Endpoint, EndpointPool
from factory.llm.pricing import Price, cost
from factory.llm.retry import RetryPolicy
from factory.llm.types import Completion, Request, Usage

KEY = "sk-test-SECRETSECRETSECRET0123"
KEY_ENV = "FACTORY_TEST_LLM_KEY"
MESSAGES = [{"role": "user", "content": "hello"}]
USAGE = {
    "prompt_tokens": 1200,
    "completion_tokens": 300,
    "total_tokens": 1500,
    "prompt_tokens_details": {"cached_tokens": 1000},
    "completion_tokens_details": {"reasoning_tokens": 100},
}
PRICE = Price(input_per_mtok=2.0, cached_input_per_mtok=0.5, output_per_mtok=8.0)
NO_RETRY = RetryPolicy(max_attempts=1)
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.5, max_delay=30.0, jitter=False)


# --------------------------------------------------------------------------- server


def completion_body(
    text: str = "hi there", *, reasoning_field: str | None = None, reasoning: str = "thinking"
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning_field:
        message[reasoning_field] = reasoning
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "served-model",
        "system_fingerprint": "fp_test",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": USAGE,
    }


def ok(**kwargs: Any) -> dict[str, Any]:
    delay = kwargs.pop("delay", 0.0)
    return {"status": 200, "body": completion_body(**kwargs), "delay": delay}


def fail(status: int, message: str = "nope", headers: dict[str, str] | None = None) -> dict:
    return {"status": status, "body": {"error": {"message": message}}, "headers": headers or {}}


class ScriptedServer:
    def __init__(self) -> None:
        self.replies: collections.deque[dict[str, Any]] = collections.deque()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        # Handlers of an earlier test (a slow reply the client gave up on) may still be
        # sleeping; they belong to an older generation and are not counted.
        self._generation = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: dict[str, Any]) -> None:
        with self._lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self.replies.clear()
            self.requests.clear()
            self.max_in_flight = 0
            self.in_flight = 0
            self._generation += 1

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.requests.append({"headers": dict(request.headers), "json": body})
            reply = self.replies.popleft() if self.replies else fail(418, "script exhausted")
            generation = self._generation
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if reply.get("delay"):
                await asyncio.sleep(reply["delay"])
            return web.json_response(
                reply["body"], status=reply["status"], headers=reply.get("headers")
            )
        finally:
            with self._lock:
                if generation == self._generation:
                    self.in_flight -= 1

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> ScriptedServer:
        self._thread.start()
        assert self._ready.wait(10), "test server did not start"
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def _server_instance() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    yield server
    server.stop()


@pytest.fixture
def server(_server_instance: ScriptedServer) -> Iterator[ScriptedServer]:
    _server_instance.reset()
    yield _server_instance
    _server_instance.reset()


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, KEY)
    secrets.clear_secrets()
    yield
    secrets.clear_secrets()


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


class Recorder:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


TRANSPORTS = {"openai": sdk_transport, "aiohttp": aiohttp_transport}
_transport: list[str] = ["openai"]


@pytest.fixture(autouse=True, params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every client test runs over both HTTP transports (the SDK and the lean one)."""
    _transport[0] = request.param
    yield request.param
    _transport[0] = "openai"


def make_client(
    endpoints: list[Endpoint],
    *,
    model: str = "gpt-4o",
    sampling: dict[str, Any] | None = None,
    retry: RetryPolicy = NO_RETRY,
    timeout_s: float = 5.0,
    concurrency: int = 8,
    price: Price | None = PRICE,
    sleep: Recorder | None = None,
    threshold: int = 3,
    **kwargs: Any,
) -> LLMClient:
    pool = EndpointPool(endpoints, failure_threshold=threshold, cooldown_s=60.0)
    kwargs.setdefault("client_factory", TRANSPORTS[_transport[0]])
    return LLMClient(
        pool,
        model,
        sampling if sampling is not None else {"temperature": 0.2, "max_tokens": 256},
        concurrency=concurrency,
        timeout_s=timeout_s,
        retry=retry,
        price=price,
        sleep=sleep or Recorder(),
        **kwargs,
    )


def run(client: LLMClient, request_id: str = "row-1") -> Completion:
    async def go() -> Completion:
        async with client:
            return await client.complete(Request.of(request_id, MESSAGES))

    return asyncio.run(go())


def run_error(client: LLMClient) -> LLMError:
    with pytest.raises(LLMError) as info:
        run(client)
    return info.value


def live(server: ScriptedServer, **kwargs: Any) -> Endpoint:
    return Endpoint(server.base_url, api_key_env=KEY_ENV, name="live", **kwargs)


# --------------------------------------------------------------------------- success


def test_completion_fields_and_request_shape(server: ScriptedServer) -> None:
    server.push(ok(text="answer", reasoning_field="reasoning_content"))
    result = run(make_client([live(server)]), request_id="row-42")
    assert result.text == "answer"
    assert result.reasoning == "thinking"
    assert result.usage == Usage(input=1200, cached_input=1000, output=300, reasoning=100)
    assert result.cost_usd == pytest.approx(cost(usage_from_openai(USAGE), PRICE))
    assert result.cost_usd == pytest.approx((200 * 2.0 + 1000 * 0.5 + 300 * 8.0) / 1e6)
    assert (result.endpoint, result.attempts, result.model) == ("live", 1, "served-model")
    assert result.system_fingerprint == "fp_test" and result.finish_reason == "stop"
    assert result.latency_s > 0

    (request,) = server.requests
    assert request["json"] == {
        "model": "gpt-4o",
        "messages": MESSAGES,
        "temperature": 0.2,
        "max_tokens": 256,
    }
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["x-client-request-id"] == "row-42"
    if _transport[0] == "openai":
        assert headers["x-stainless-retry-count"] == "0"


def test_reasoning_field_named_reasoning_is_read(server: ScriptedServer) -> None:
    server.push(ok(reasoning_field="reasoning", reasoning="vllm style"))
    assert run(make_client([live(server)])).reasoning == "vllm style"


def test_no_reasoning_and_unpriced_model(server: ScriptedServer) -> None:
    server.push(ok())
    result = run(make_client([live(server)], model="Qwen/Qwen3-8B", price=None))
    assert result.reasoning is None and result.cost_usd == 0.0


def test_reasoning_model_request_uses_its_parameters(server: ScriptedServer) -> None:
    server.push(ok())
    sampling = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 900, "reasoning_effort": "low"}
    client = make_client([live(server)], model="o4-mini", sampling=sampling)
    assert set(client.request_params.dropped) == {"temperature", "top_p"}
    run(client)
    body = server.requests[0]["json"]
    assert body == {
        "model": "o4-mini",
        "messages": MESSAGES,
        "max_completion_tokens": 900,
        "reasoning_effort": "low",
    }


def test_totals_accumulate(server: ScriptedServer) -> None:
    server.push(ok(), fail(500), ok())
    client = make_client([live(server)], retry=FAST_RETRY)

    async def go() -> None:
        async with client:
            await client.complete(Request.of("a", MESSAGES))
            await client.complete(Request.of("b", MESSAGES))

    asyncio.run(go())
    totals = client.totals()
    assert totals["calls"] == 2 and totals["failed"] == 0 and totals["attempts"] == 3
    assert totals["input_tokens"] == 2400
    assert totals["cost_usd"] == pytest.approx(2 * cost(usage_from_openai(USAGE), PRICE))


# --------------------------------------------------------------------------- retries


def test_retry_after_is_honoured(server: ScriptedServer) -> None:
    server.push(fail(429, "slow down", {"Retry-After": "2"}), ok())
    sleep = Recorder()
    result = run(make_client([live(server)], retry=FAST_RETRY, sleep=sleep))
    assert result.attempts == 2
    assert sleep.delays == [2.0]  # no jitter in FAST_RETRY: exactly the server's hint
    assert len(server.requests) == 2


def test_backoff_sequence_on_server_errors(server: ScriptedServer) -> None:
    server.push(fail(500), fail(503), fail(429, headers={"Retry-After": "7"}), ok())
    sleep = Recorder()
    result = run(make_client([live(server)], retry=FAST_RETRY, sleep=sleep, threshold=10))
    assert result.attempts == 4
    assert sleep.delays == [0.5, 1.0, 7.0]


def test_last_error_raised_after_max_attempts(server: ScriptedServer) -> None:
    server.push(fail(502), fail(502), fail(502), fail(502))
    sleep = Recorder()
    err = run_error(make_client([live(server)], retry=FAST_RETRY, sleep=sleep, threshold=10))
    assert isinstance(err, LLMServerError) and err.status == 502
    assert err.attempts == 4  # type: ignore[attr-defined]
    assert err.row_id == "row-1"
    assert len(sleep.delays) == 3 and len(server.requests) == 4


def test_bad_request_is_not_retried(server: ScriptedServer) -> None:
    server.push(fail(400, "bad param"), ok())
    err = run_error(make_client([live(server)], retry=FAST_RETRY))
    assert isinstance(err, LLMBadRequest) and err.status == 400
    assert len(server.requests) == 1


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_slow_reply_times_out(server: ScriptedServer) -> None:
    server.push({**ok(), "delay": 10.0})
    started = time.monotonic()
    err = run_error(make_client([live(server)], timeout_s=1.0))
    assert isinstance(err, LLMTimeout) and err.endpoint == "live"
    assert time.monotonic() - started < 8.0  # cut by the timeout, not the reply


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_timeout_then_success_on_retry(server: ScriptedServer) -> None:
    # A timeout generous enough that the immediate second reply cannot miss it on a busy
    # machine; the first reply comes far later than it.
    server.push({**ok(), "delay": 10.0}, ok(text="second"))
    result = run(make_client([live(server)], timeout_s=2.0, retry=FAST_RETRY))
    assert (result.text, result.attempts) == ("second", 2)


# --------------------------------------------------------------------------- translation


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, LLMBadRequest),
        (401, LLMBadRequest),
        (404, LLMBadRequest),
        (422, LLMBadRequest),
        (408, LLMServerError),
        (409, LLMServerError),
        (429, LLMRateLimited),
        (500, LLMServerError),
        (502, LLMServerError),
        (503, LLMServerError),
    ],
)
def test_status_codes_are_translated(
    server: ScriptedServer, status: int, expected: type[LLMError]
) -> None:
    server.push(fail(status, "server says no"))
    err = run_error(make_client([live(server)]))
    assert type(err) is expected
    assert err.status == status and err.endpoint == "live"
    assert "server says no" in str(err)
    if _transport[0] == "openai":  # translated at the boundary, chained to the SDK error
        assert isinstance(err.__cause__, openai.APIStatusError)


def test_rate_limit_http_date_retry_after(server: ScriptedServer) -> None:
    when = datetime.now(timezone.utc) + timedelta(seconds=30)
    server.push(fail(429, headers={"Retry-After": format_datetime(when, usegmt=True)}))
    err = run_error(make_client([live(server)]))
    assert isinstance(err, LLMRateLimited)
    assert err.retry_after is not None and 25 <= err.retry_after <= 30


def test_connection_error_is_a_server_error() -> None:
    err = run_error(make_client([Endpoint(closed_port_url(), name="dead")]))
    assert isinstance(err, LLMServerError) and err.endpoint == "dead"
    cause = openai.APIConnectionError if _transport[0] == "openai" else aiohttp.ClientError
    assert isinstance(err.__cause__, cause)


def test_response_without_choices_is_a_server_error(server: ScriptedServer) -> None:
    server.push({"status": 200, "body": {**completion_body(), "choices": []}})
    err = run_error(make_client([live(server)]))
    assert isinstance(err, LLMServerError) and "no choices" in str(err)


class FakeSDK:
    """A non-HTTP stand-in passed through client_factory."""

    def __init__(self, outcome: object) -> None:
        self.outcome = outcome
        self.calls: list[dict[str, Any]] = []
        self.closed = False
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    async def close(self) -> None:
        self.closed = True


def test_injected_client_with_plain_objects() -> None:
    response = {
        "choices": [{"message": {"content": None, "reasoning": "r"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 20},
        "model": "m",
    }
    fake = FakeSDK(response)
    client = make_client(
        [Endpoint("http://10.1.2.3:8000/v1", name="gpu")],
        client_factory=lambda e, *a: SDKTransport(e, fake),
    )
    result = run(client, request_id="r\u00e9sum\u00e9")
    assert (result.text, result.reasoning, result.finish_reason) == ("", "r", "length")
    assert result.system_fingerprint is None
    assert result.cost_usd == pytest.approx((10 * 2.0 + 20 * 8.0) / 1e6)
    assert fake.calls[0]["extra_headers"] == {"X-Client-Request-Id": "r_sum_"}
    assert fake.closed


def test_programming_errors_propagate_and_free_the_endpoint() -> None:
    fake = FakeSDK(KeyError("bug in a fake"))
    client = make_client(
        [Endpoint("http://10.1.2.3:8000/v1", name="gpu")],
        client_factory=lambda e, *a: SDKTransport(e, fake),
        retry=FAST_RETRY,
    )
    with pytest.raises(KeyError):
        run(client)
    assert len(fake.calls) == 1
    stats = client.pool.stats()["gpu"]
    assert (stats.in_flight, stats.failures) == (0, 0)


# --------------------------------------------------------------------------- pool


def test_failover_from_a_dead_endpoint(server: ScriptedServer) -> None:
    dead = Endpoint(closed_port_url(), name="dead")
    server.push(*(ok() for _ in range(5)))
    client = make_client([dead, live(server)], retry=FAST_RETRY, threshold=2)

    async def go() -> list[Completion]:
        async with client:
            return [await client.complete(Request.of(f"r{i}", MESSAGES)) for i in range(5)]

    results = asyncio.run(go())
    assert all(r.endpoint == "live" for r in results)
    # round robin sends the first try to "dead"; the retry fails over to "live"
    assert results[0].attempts == 2
    stats = client.pool.stats()
    assert stats["dead"].failures == 2
    assert stats["dead"].state is CircuitState.OPEN  # after 2 consecutive failures
    assert results[-1].attempts == 1  # an open breaker is no longer tried
    assert stats["live"].requests == 5 and stats["live"].in_flight == 0


def test_concurrency_bound_is_respected(server: ScriptedServer) -> None:
    server.push(*({**ok(), "delay": 0.15} for _ in range(9)))
    client = make_client([live(server)], concurrency=3)

    async def go() -> list[Completion]:
        async with client:
            return await asyncio.gather(
                *(client.complete(Request.of(f"r{i}", MESSAGES)) for i in range(9))
            )

    results = asyncio.run(go())
    assert len(results) == 9 and all(r.text == "hi there" for r in results)
    assert server.max_in_flight == 3


def test_clients_built_once_per_endpoint_without_sdk_retries(server: ScriptedServer) -> None:
    built: list[tuple[str, str, float, Any]] = []

    def factory(endpoint: Endpoint, api_key: str, timeout_s: float) -> Any:
        client = sdk_transport(endpoint, api_key, timeout_s)
        built.append((endpoint.name, api_key, timeout_s, client.sdk))
        return client

    other = Endpoint(server.base_url.replace("127.0.0.1", "localhost"), name="other")
    server.push(ok(), ok(), ok())
    client = make_client([live(server), other], client_factory=factory, timeout_s=7.0)

    async def go() -> None:
        async with client:
            for i in range(3):
                await client.complete(Request.of(f"r{i}", MESSAGES))

    asyncio.run(go())
    assert [(n, k, t) for n, k, t, _ in built] == [("live", KEY, 7.0), ("other", "EMPTY", 7.0)]
    assert all(c.max_retries == 0 for *_, c in built)


# --------------------------------------------------------------------------- keys


def test_each_endpoint_gets_only_its_own_key(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-must-not-leak-000")
    monkeypatch.setenv("FACTORY_TEST_OTHER_KEY", "other-endpoint-key-111")
    keyed = Endpoint(server.base_url, api_key_env=KEY_ENV, name="keyed")
    other = Endpoint(
        server.base_url.replace("127.0.0.1", "localhost"),
        api_key_env="FACTORY_TEST_OTHER_KEY",
        name="other",
    )
    bare = Endpoint(server.base_url + "/", name="bare")  # no key configured
    server.push(ok(), ok(), ok())
    client = make_client([keyed, other, bare])

    async def go() -> list[str]:
        async with client:
            return [
                (await client.complete(Request.of(f"r{i}", MESSAGES))).endpoint for i in range(3)
            ]

    assert asyncio.run(go()) == ["keyed", "other", "bare"]
    auth = [r["headers"]["Authorization"] for r in server.requests]
    assert auth == [f"Bearer {KEY}", "Bearer other-endpoint-key-111", "Bearer EMPTY"]


def test_local_endpoint_with_unset_variable_gets_a_placeholder(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    server.push(ok())
    run(make_client([live(server)]))
    assert server.requests[0]["headers"]["Authorization"] == "Bearer EMPTY"


def test_missing_key_for_remote_endpoint_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FACTORY_TEST_REMOTE_KEY", raising=False)
    remote = Endpoint("https://llm.example.com/v1", api_key_env="FACTORY_TEST_REMOTE_KEY")
    with pytest.raises(ConfigError, match="FACTORY_TEST_REMOTE_KEY") as info:
        make_client([remote])
    assert info.value.key_path == "llm.endpoints.api_key_env"
    assert "export FACTORY_TEST_REMOTE_KEY" in str(info.value)


def test_openai_without_api_key_env_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        make_client([Endpoint("https://api.openai.com/v1")])


def test_provider_key_is_never_shared_with_a_local_endpoint(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-must-not-leak-000")
    provider = Endpoint("https://api.openai.com/v1", api_key_env="OPENAI_API_KEY")
    local = Endpoint(server.base_url, api_key_env="OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="belongs to a remote endpoint"):
        make_client([provider, local])


def test_key_never_appears_in_errors_or_redacted_logs(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    echo = f"Incorrect API key provided: {KEY}. Authorization: Bearer {KEY}"
    server.push(fail(500, echo), fail(401, echo))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    flt = secrets.install_log_redaction()
    try:
        with caplog.at_level(logging.DEBUG):  # retry lines are DEBUG (summarised otherwise)
            err = run_error(make_client([live(server)], retry=FAST_RETRY))
            # what a stage would do with a failed row: log it with its traceback
            logging.getLogger("factory.stage").error(
                "row failed: %s (cause %s)", err.describe(), err.__cause__, exc_info=err
            )
    finally:
        root.removeHandler(handler)
        for h in [root, *root.handlers]:
            h.removeFilter(flt)
    assert isinstance(err, LLMBadRequest) and err.status == 401
    assert KEY not in str(err) and KEY not in err.describe()
    if _transport[0] == "openai":
        assert KEY in str(err.__cause__)  # the SDK's own text does carry it ...
    logged = stream.getvalue() + caplog.text
    assert "retrying in" in logged and "row failed" in logged
    assert KEY not in logged  # ... but nothing logged does
    assert "***" in logged
