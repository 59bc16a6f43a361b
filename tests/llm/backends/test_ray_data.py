"""``llm.backend: ray_data``: its pure pieces (options, payloads, envelopes, the vLLM row
mapping) and Ray's real HTTP stage driven over the development server with this
backend's session, without a Ray cluster. The whole run is ``tests/e2e/test_ray_data.py``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from factory.errors import (
    ConfigError,
    LLMBadRequest,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
)
from factory.llm.backends import BackendSetup, backend_options, get_backend
from factory.llm.backends.openai_wire import completion_from_openai
from factory.llm.backends.ray_data import RayDataOptions, specs
from factory.llm.backends.ray_data.gateway import pad
from factory.llm.backends.ray_data.processors import (
    ProcessorSpec,
    concurrent_batches,
    processor_row,
    read_output,
    vllm_envelope,
    vllm_payload,
    vllm_sampling,
)
from factory.llm.backends.ray_data.session import (
    FILLER,
    SessionFactory,
    close_loop_session,
    envelope,
)
from factory.llm.backends.ray_data.transport import gateway_name, http_payload, read_envelope
from factory.llm.errormap import translate_error
from factory.llm.types import Usage
from factory.recipe import load_recipe
from tests.conftest import ROOT


def _llm(*overrides: str) -> Any:
    cfg = load_recipe(
        ROOT / "pipelines" / "airline.yaml",
        ["llm.model=m", "llm.backend=ray_data", "llm.concurrency=64", *overrides],
    )
    return cfg.llm


def _setup(llm: Any, **options: Any) -> BackendSetup:
    plugin = get_backend("ray_data")
    return BackendSetup(
        llm=llm,
        model="m",
        options=backend_options(plugin, options),
        concurrency=32,
        price=None,
        run_dir="/out",
    )


def _failure(text: str) -> LLMError | None:
    """What the worker makes of an envelope: the response, or the translated failure."""
    try:
        read_envelope(text)
    except Exception as exc:  # what the transport raises is translated as LLMClient does
        return translate_error(exc, "ep")
    return None


# -- options and specs -------------------------------------------------------------------
def test_vllm_options_with_the_http_processor_are_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        backend_options(get_backend("ray_data"), {"processor": "http", "vllm": {}})
    assert info.value.key_path == "llm.backend_options"
    with pytest.raises(ConfigError) as info:
        backend_options(get_backend("ray_data"), {"batch_size": 0})
    assert info.value.key_path == "llm.backend_options.batch_size"


def test_one_http_processor_per_endpoint_with_enough_batches_for_the_concurrency() -> None:
    urls = json.dumps([{"base_url": "http://a:1/v1"}, {"base_url": "http://b:2/v1"}])
    pairs = specs(_setup(_llm(f"llm.endpoints={urls}"), replicas=2, batch_size=4))
    assert [s.url for _, s in pairs] == [
        "http://a:1/v1/chat/completions",
        "http://b:2/v1/chat/completions",
    ]
    spec = pairs[0][1]
    assert spec.kind == "http" and spec.concurrent_batches == 8  # 64 / (2 x 4)
    assert spec.in_flight == 64
    assert concurrent_batches(65, 2, 4) == 9
    names = {gateway_name("/out", s) for _, s in pairs}
    assert len(names) == 2 and gateway_name("/other", spec) not in names


def test_the_vllm_processor_is_one_in_process_endpoint_for_the_stage_model() -> None:
    setup = _setup(
        _llm(),
        processor="vllm",
        batch_size=32,
        vllm={"engine_kwargs": {"max_model_len": 8192}, "accelerator_type": "H100"},
    )
    [(endpoint, spec)] = specs(setup)
    assert spec.kind == "vllm" and spec.model_source == "m" and spec.batch_size == 32
    assert json.loads(spec.engine_kwargs) == {"max_model_len": 8192}
    assert endpoint.name == "ray_data:vllm:m"
    assert isinstance(setup.options, RayDataOptions)


def test_building_the_backend_starts_nothing() -> None:
    local = json.dumps([{"base_url": "http://127.0.0.1:9/v1"}])
    backend = get_backend("ray_data").build(_setup(_llm(f"llm.endpoints={local}")))
    assert backend.model == "m" and not backend.batched


# -- payloads and envelopes ------------------------------------------------------------
def test_the_http_payload_is_the_body_the_aiohttp_backend_sends() -> None:
    kwargs = {
        "model": "m",
        "messages": [{"role": "user", "content": "héllo"}],
        "max_tokens": 5,
        "extra_headers": {"X-Client-Request-Id": "amplify-1"},
    }
    payload = json.loads(http_payload(kwargs))
    assert payload["request_id"] == "amplify-1"
    body = {k: v for k, v in kwargs.items() if k != "extra_headers"}
    assert payload["body"] == json.dumps(body, ensure_ascii=False)


def test_a_2xx_envelope_is_the_response() -> None:
    body = {"model": "m", "choices": [{"message": {"content": "hi"}}], "usage": {"total_tokens": 3}}
    response = read_envelope(envelope(200, json.dumps(body)))
    assert response == body
    completion = completion_from_openai(response, "gateway", "m")
    assert completion.text == "hi" and completion.endpoint == "gateway"


@pytest.mark.parametrize(
    ("text", "kind", "retryable"),
    [
        # a non-2xx status with a JSON body is an error, never a success
        (envelope(400, json.dumps({"error": {"message": "bad model"}})), LLMBadRequest, False),
        (envelope(404, "{}"), LLMBadRequest, False),
        (envelope(503, "overloaded"), LLMServerError, True),
        (envelope(200, "not json"), LLMServerError, True),
        (envelope(error=("timeout", "timed out")), LLMTimeout, True),
        (envelope(error=("connection", "ClientConnectorError: refused")), LLMServerError, True),
        (envelope(error=("inference", "ValueError: prompt too long")), LLMBadRequest, False),
        (envelope(error=("inference", "RuntimeError: CUDA error")), LLMServerError, True),
        (envelope(error=("processor", "the Ray Data execution failed")), LLMServerError, True),
    ],
)
def test_a_failed_envelope_is_a_typed_llm_error(text: str, kind: type, retryable: bool) -> None:
    err = _failure(text)
    assert isinstance(err, kind) and err.retryable == retryable


def test_a_429_keeps_the_servers_retry_after() -> None:
    err = _failure(envelope(429, "{}", retry_after=2.5))
    assert isinstance(err, LLMRateLimited) and err.retry_after == 2.5


# -- the vLLM rows -----------------------------------------------------------------------
def test_vllm_sampling_keeps_what_the_engine_knows() -> None:
    params = {"temperature": 0.7, "max_completion_tokens": 100, "reasoning_effort": "low"}
    assert vllm_sampling(params) == {"temperature": 0.7, "max_tokens": 100}
    payload = json.loads(vllm_payload({"model": "m", "messages": [{"role": "user"}], **params}))
    assert payload["sampling_params"] == {"temperature": 0.7, "max_tokens": 100}
    row = processor_row("vllm", 3, json.dumps(payload))
    assert row["messages"] == [{"role": "user"}] and row["factory_token"] == 3


def test_an_engine_row_becomes_an_openai_body_with_the_engines_token_counts() -> None:
    row = {
        "factory_token": 7,
        "generated_text": "answer",
        "num_input_tokens": 120,
        "num_generated_tokens": 16,
        "sampling_params": {"max_tokens": 16},
        "__inference_error__": "",
    }
    token, text = read_output(row, "m")
    completion = completion_from_openai(read_envelope(text), "gateway", "m")
    assert token == 7 and completion.text == "answer"
    assert completion.usage == Usage(input=120, output=16)
    assert completion.finish_reason == "length"
    failed = vllm_envelope({**row, "__inference_error__": "ValueError: too long"}, "m")
    assert isinstance(_failure(failed), LLMBadRequest)


def test_a_pull_is_padded_to_whole_batches() -> None:
    rows = [{"factory_token": i, "payload": "p"} for i in range(5)]
    padded = pad(rows, 4, FILLER)
    assert len(padded) == 8 and [r["factory_token"] for r in padded[5:]] == [-1, -1, -1]
    assert pad(rows[:4], 4, FILLER) == rows[:4]


# -- Ray's own HTTP stage with this backend's session --------------------------------------
def _ray_http_stage(url: str, rows: list[dict[str, Any]]) -> list[str]:
    """Run Ray 2.60's ``HttpRequestUDF`` (the processor's stage class) over one batch."""
    from ray.llm._internal.batch.stages.http_request_stage import HttpRequestUDF

    udf = HttpRequestUDF(
        data_column="__data",
        expected_input_keys=["payload"],
        url=url,
        session_factory=SessionFactory(None, 5.0),
    )

    async def run() -> list[dict[str, Any]]:
        try:
            return [out async for out in udf({"__data": rows})]
        finally:
            await close_loop_session()

    [out] = asyncio.run(run())
    return [read_output(r, "m")[1] for r in out["__data"]]


def test_rays_http_stage_through_the_session_keeps_every_status(devserver: Any) -> None:
    server = devserver(strict_models=True, latency_ms=1)
    url = server.url.rstrip("/") + "/chat/completions"

    def payload(model: str) -> str:
        return http_payload({"model": model, "messages": [{"role": "user", "content": "hi"}]})

    rows = [
        processor_row("http", 0, payload("factory-dev")),
        processor_row("http", 1, payload("no-such-model")),  # 404 with a JSON body
        processor_row("http", 2, FILLER),
    ]
    ok, unknown, filler = _ray_http_stage(url, rows)
    assert completion_from_openai(read_envelope(ok), "gateway", "factory-dev").text
    assert isinstance(_failure(unknown), LLMBadRequest)
    assert json.loads(filler)["status"] == 200


def test_an_unreachable_server_is_a_connection_failure_not_a_failed_batch() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    payload = http_payload({"model": "m", "messages": []})
    [text] = _ray_http_stage(
        f"http://127.0.0.1:{port}/v1/chat/completions", [processor_row("http", 0, payload)]
    )
    err = _failure(text)
    assert isinstance(err, LLMServerError) and "connection failed" in str(err)


def test_the_processor_spec_is_hashable_and_picklable() -> None:
    import pickle

    spec = ProcessorSpec(kind="http", batch_size=1, replicas=1, concurrent_batches=4, url="u")
    assert pickle.loads(pickle.dumps(spec)) == spec and hash(spec) == hash(spec)
    assert pickle.loads(pickle.dumps(SessionFactory("K", 1.0))) == SessionFactory("K", 1.0)


# --- the gateway's request queue, in this process ---------------------------------------


def _gateway(batch_size: int = 2) -> Any:
    from factory.llm.backends.ray_data import gateway as gw

    g = gw.Gateway(
        ProcessorSpec(kind="http", batch_size=batch_size, replicas=1, concurrent_batches=1, url="u")
    )
    g._start = lambda: None  # no Ray Data execution: the test plays the read task
    return g


def test_the_gateway_hands_waiting_requests_to_the_read_task_padded_to_its_batches() -> None:
    """``call`` queues a request and waits; ``pull`` gives the read task what waits, padded
    to whole batches with fillers (token -1); an answer reaches its own caller only; a
    caller that gave up is never sent; after ``close`` the read task hears None."""
    from factory.llm.backends.ray_data import gateway as gw

    async def go() -> None:
        g = _gateway(batch_size=2)
        first = asyncio.ensure_future(g.call("p0"))
        second = asyncio.ensure_future(g.call("p1"))
        third = asyncio.ensure_future(g.call("p2"))
        await asyncio.sleep(0)
        third.cancel()  # its caller gave up before the read task came
        await asyncio.sleep(0)
        rows = await g.pull()
        assert [(r[gw.TOKEN], r["payload"]) for r in rows] == [(0, "p0"), (1, "p1")]
        g._deliver(1, "answer-1")
        g._deliver(0, "answer-0")
        g._deliver(7, "nobody waits for this")
        assert await first == "answer-0" and await second == "answer-1"
        fourth = asyncio.ensure_future(g.call("p3"))
        await asyncio.sleep(0)
        padded = await g.pull()
        assert [r[gw.TOKEN] for r in padded] == [3, -1]  # one request, one filler
        g._deliver(3, "answer-3")
        assert await fourth == "answer-3"
        g.close()
        assert await g.pull() is None

    asyncio.run(go())


def test_a_pull_with_nothing_waiting_returns_empty_after_its_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from factory.llm.backends.ray_data import gateway as gw

    monkeypatch.setattr(gw, "PULL_WAIT_S", 0.01)
    assert asyncio.run(_gateway().pull()) == []
