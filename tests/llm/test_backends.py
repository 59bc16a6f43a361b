"""The LLM backend seam (issue 9, point 3): registry, protocol, render -> call -> record.

The proof that adding a backend touches no engine file: ``EchoBackend`` below is
defined here, registered through the public hook with its own config model, and
driven by the real ``AmplifyStage`` and ``PrefilterStage`` (no Ray, no server).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from factory.errors import ConfigError, LLMBadRequest, LLMServerError, LLMUnavailable
from factory.llm import Completion, Message, Usage
from factory.llm.backends import (
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
    LLMRequest,
    LLMResult,
    available_backends,
    build_backend,
    get_backend,
    register_backend,
    reset_registry,
)
from factory.recipe import Recipe, load_recipe
from tests.conftest import ROOT
from tests.helpers import amplify_stage, prefilter_stage, stage_settings

SEEDS = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()


def completion(text: str, cost: float = 0.25) -> Completion:
    return Completion(
        text=text,
        reasoning=None,
        usage=Usage(input=40, output=8),
        cost_usd=cost,
        endpoint="echo",
        attempts=1,
        latency_s=0.0,
        model="m",
        system_fingerprint=None,
        retries={"llm_rate_limited": 1},
    )


class EchoOptions(BackendOptions):
    answer: str = "echo"
    fail_ids: tuple[str, ...] = ()


class EchoBackend(Backend):
    """A batched, in-process backend: answers every request of a call at once, in
    reverse order (a backend may yield in any order), and records each call."""

    batched = True

    def __init__(self, setup: BackendSetup):
        assert isinstance(setup.options, EchoOptions)
        self.model = setup.model
        self.options = setup.options
        self.calls: list[list[str]] = []
        CREATED.append(self)

    async def run(self, requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
        self.calls.append([r.request_id for r in requests])
        await asyncio.sleep(0)
        for r in reversed(requests):
            if r.request_id in self.options.fail_ids:
                yield LLMResult(r.request_id, error=LLMBadRequest("echo: refused", status=400))
            else:
                answer = self.options.answer.replace("{n}", str(len(self.calls)))
                yield LLMResult(r.request_id, completion=completion(answer))


CREATED: list[EchoBackend] = []


@pytest.fixture
def echo() -> Iterator[None]:
    reset_registry()
    CREATED.clear()
    register_backend(BackendPlugin("echo", EchoOptions, EchoBackend))
    yield
    reset_registry()


def cfg_for(tmp_path: Path, *overrides: str) -> Recipe:
    return load_recipe(
        ROOT / "pipelines" / "airline.yaml",
        [
            f"output.dir={tmp_path / 'out'}",
            "amplify.max_cost_usd=null",  # no budget actor (no Ray here)
            "llm.endpoints=" + json.dumps([{"base_url": "http://127.0.0.1:9/v1"}]),
            *overrides,
        ],
    )


def seeds(n: int) -> dict[str, str]:
    from factory.core.formats import parse_record

    out = {}
    for i, line in enumerate(SEEDS[:n]):
        traj = parse_record(json.loads(line), source=f"s:{i}")
        out[traj.id] = traj.to_json()
    return out


# ------------------------------------------------------------------ the registry


def test_an_unknown_backend_is_a_config_error_naming_the_key_and_the_choices(
    tmp_path: Path,
) -> None:
    from factory.engine.stages.llm_stage import build_backend_for

    cfg = cfg_for(tmp_path, "llm.backend=vllm-on-mars")
    with pytest.raises(ConfigError) as info:
        build_backend_for(stage_settings(cfg, model="gpt-5"))
    assert info.value.key_path == "llm.backend"
    assert "vllm-on-mars" in str(info.value)
    assert f"choices: {', '.join(available_backends())} (" in str(info.value)


def test_built_ins_load_through_the_same_hook_lazily() -> None:
    from factory.llm.backends.aiohttp import AiohttpOptions
    from factory.llm.backends.openai import OpenAIOptions

    reset_registry()
    assert {"aiohttp", "openai"} <= set(available_backends())
    assert get_backend("aiohttp").options is AiohttpOptions
    assert get_backend("openai").options is OpenAIOptions


@pytest.mark.parametrize("name", ["aiohttp", "openai"])
def test_the_http_backends_are_online_backends_over_one_client(tmp_path: Path, name: str) -> None:
    from factory.engine.stages.llm_stage import build_backend_for
    from factory.llm.backends.online import ClientBackend

    backend = build_backend_for(
        stage_settings(cfg_for(tmp_path, f"llm.backend={name}"), model="gpt-5")
    )
    assert isinstance(backend, ClientBackend) and not backend.batched
    assert backend.model == "gpt-5"
    asyncio.run(backend.aclose())


@pytest.mark.parametrize(
    ("url", "setting", "share"),
    [
        ("http://127.0.0.1:8000/v1", None, 0.02),  # a local vLLM: a cancel costs nothing
        ("https://api.openai.com/v1", None, 0.0),  # a provider may bill a cancelled request
        ("https://api.openai.com/v1", 0.05, 0.05),  # asked for
        ("http://127.0.0.1:8000/v1", 0, 0.0),  # turned off
    ],
    ids=["local", "provider", "provider-asked", "local-off"],
)
def test_hedging_is_on_by_default_only_where_a_cancel_costs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, setting: float | None, share: float
) -> None:
    from factory.engine.stages.llm_stage import build_backend_for
    from factory.llm.backends.online import ClientBackend

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    overrides = [
        "llm.endpoints=" + json.dumps([{"base_url": url, "api_key_env": "OPENAI_API_KEY"}])
    ]
    if setting is not None:
        overrides.append(f"llm.deadline.hedge_share={setting}")
    backend = build_backend_for(stage_settings(cfg_for(tmp_path, *overrides), model="gpt-5"))
    assert isinstance(backend, ClientBackend)
    assert backend.client.deadline.hedge_share == share
    asyncio.run(backend.aclose())


def test_backend_options_are_checked_by_the_backends_config_model(echo: None) -> None:
    cfg = load_recipe(
        ROOT / "pipelines" / "airline.yaml",
        ["llm.backend=echo", 'llm.backend_options={"colour": "red"}'],
    )
    assert cfg.llm is not None
    with pytest.raises(ConfigError) as info:
        build_backend(cfg.llm, "m", concurrency=1, price=None)
    assert info.value.key_path == "llm.backend_options.colour"
    assert "answer" in str(info.value)  # lists the options it does have


def test_a_name_cannot_be_registered_twice(echo: None) -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_backend(BackendPlugin("aiohttp", EchoOptions, EchoBackend))


def test_llm_transport_is_a_deprecated_alias(caplog: pytest.LogCaptureFixture) -> None:
    recipe = ROOT / "pipelines" / "airline.yaml"
    with caplog.at_level(logging.WARNING, logger="factory"):
        cfg = load_recipe(recipe, ["llm.transport=openai"])
    assert cfg.llm is not None and cfg.llm.backend == "openai"
    assert "deprecated" in caplog.text and "backend: openai" in caplog.text
    with pytest.raises(ConfigError) as info:
        load_recipe(recipe, ["llm.transport=openai", "llm.backend=aiohttp"])
    assert info.value.key_path == "llm.transport"
    assert load_recipe(recipe).llm.backend == "aiohttp"  # type: ignore[union-attr]


# ------------------------------------------------------------------ render and record (pure)


def test_render_is_a_pure_function_of_its_inputs() -> None:
    from factory.engine.stages.llm_stage import render, request_id

    msgs = [{"role": "user", "content": "hi"}]
    a = render("amplify", "gpt-5", {"seed": 1}, msgs, seed="s1", variation=0)
    assert a == render("amplify", "gpt-5", {"seed": 1}, msgs, seed="s1", variation=0)
    assert a.request_id == request_id("amplify", "gpt-5", {"seed": 1}, msgs, seed="s1", variation=0)
    assert a.messages == (Message("user", "hi"),) and a.request_id.startswith("amplify-")
    assert a.static_prefix == 0 and a.sampling == {"seed": 1}
    system = [{"role": "system", "content": "policy"}, *msgs]  # the stage's static block
    marked = render("amplify", "gpt-5", {"seed": 1}, system, seed="s1", variation=0)
    assert marked.static == (Message("system", "policy"),)
    others = {
        render("amplify", "gpt-5", {"seed": 1}, msgs, seed="s1", variation=1).request_id,
        render("amplify", "o4-mini", {"seed": 1}, msgs, seed="s1", variation=0).request_id,
        render("amplify", "gpt-5", {"seed": 2}, msgs, seed="s1", variation=0).request_id,
        render(
            "amplify",
            "gpt-5",
            {"seed": 1},
            [{"role": "user", "content": "ho"}],
            seed="s1",
            variation=0,
        ).request_id,
    }
    assert a.request_id not in others and len(others) == 4


def test_record_completion_paid_then_replayed() -> None:
    from factory.engine.stages.base import make_row
    from factory.engine.stages.llm_stage import record_completion

    row = make_row()
    record_completion(row, completion("one", cost=0.5), cached=False, stage="amplify")
    assert row["completion"] == "one" and row["cached"] is False
    assert row["paid_usd"] == 0.5 and row["cached_responses"] == 0
    assert json.loads(row["usage"]) == {
        "prompt_tokens": 40,
        "completion_tokens": 8,
        "cached_tokens": 0,
    }
    assert json.loads(row["retries"]) == {"llm_rate_limited": 1}
    record_completion(
        row, completion("two", cost=0.5), cached=True, stage="amplify"
    )  # a judge's second ask
    assert row["completion"] == "two" and row["cached"] is True
    assert row["paid_usd"] == 0.5 and row["cached_responses"] == 1  # replay: nothing paid
    assert json.loads(row["retries"]) == {"llm_rate_limited": 1}  # nor retried


def test_record_failure_failed_or_unissued() -> None:
    from factory.engine.stages.base import FAILED, UNISSUED, make_row
    from factory.engine.stages.llm_stage import record_failure

    err = LLMServerError("502 after retries")
    err.attempts = 6  # type: ignore[attr-defined]
    err.retries = {"llm_server_error": 5}  # type: ignore[attr-defined]
    row = make_row()
    record_failure(row, "amplify", err)
    assert row["status"] == FAILED and row["reason"] == "llm_server_error"
    assert row["attempts"] == 6 and json.loads(row["retries"]) == {"llm_server_error": 5}
    assert row["message"].startswith("LLMServerError: ")
    row = make_row()
    record_failure(row, "prefilter", LLMUnavailable("no endpoint"))
    assert row["status"] == UNISSUED and row["stage"] == "prefilter"


# ------------------------------------------------------------------ a new backend, end to end


def test_a_registered_batched_backend_runs_through_the_real_amplify_stage(
    echo: None, tmp_path: Path
) -> None:
    from factory.engine.stages.amplify import assign, seed_order
    from factory.engine.stages.llm_stage import render

    cfg = cfg_for(tmp_path, "llm.backend=echo", 'llm.backend_options={"answer": "call {n}"}')
    kept = seeds(3)
    stage = amplify_stage(cfg, kept)
    (backend,) = CREATED
    rows = [{"status": "ok", "call_index": i, "id": None} for i in range(7)]

    async def go(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return await stage.arun_rows(rows)
        finally:
            await stage.backend.aclose()

    out = asyncio.run(go([dict(r) for r in rows]))
    assert [r["status"] for r in out] == ["ok"] * 7
    assert len(backend.calls) == 1 and len(backend.calls[0]) == 7  # one batch of seven
    assert {r["completion"] for r in out} == {"call 1"}
    # the request ids are the ones the HTTP backends send (same render, same cache keys)
    order = seed_order(list(kept), cfg.amplify.seed)  # type: ignore[union-attr]
    for r in out:
        seed_id, variation = assign(r["call_index"], order)
        template_messages = stage.template.render(
            stage.seeds[seed_id], variation=variation
        ).messages
        expected = render(
            "amplify",
            "gpt-5",
            stage.sampling,
            template_messages,
            seed=seed_id,
            variation=variation,
        )
        assert r["request_id"] == expected.request_id
    assert all(r["paid_usd"] == 0.25 and r["cached"] is False for r in out)
    assert stage.cache is not None
    stage.cache.close()

    again = amplify_stage(cfg, kept)  # a rerun: every answer comes from the cache
    out2 = asyncio.run(_run(again, rows))
    assert CREATED[1].calls == []
    assert all(r["cached"] is True and r["paid_usd"] == 0.0 for r in out2)
    assert [r["request_id"] for r in out2] == [r["request_id"] for r in out]


async def _run(stage: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        return await stage.arun_rows([dict(r) for r in rows])
    finally:
        await stage.backend.aclose()
        if stage.cache is not None:
            stage.cache.close()


def test_a_batched_backends_failures_are_rows_and_a_judges_retry_joins_the_next_batch(
    echo: None, tmp_path: Path
) -> None:
    from factory.core.formats import parse_record
    from factory.engine.stages.base import make_row
    from factory.engine.stages.llm_stage import render

    # first batch: no verdict ("call 1" is not JSON); the retried requests form batch 2
    answer = '{"keep": true, "reasons": []}'
    cfg = cfg_for(
        tmp_path,
        "llm.backend=echo",
        "cache.enabled=false",
        "llm.backend_options=" + json.dumps({"answer": "call {n}"}),
    )
    stage = prefilter_stage(cfg)
    (backend,) = CREATED
    trajs = [parse_record(json.loads(line), source=f"s:{i}") for i, line in enumerate(SEEDS[:4])]
    refused = render(
        "prefilter",
        "o4-mini",
        stage.sampling,
        stage.template.render(trajs[0]).messages,
        seed=trajs[0].id,
    ).request_id
    backend.options = EchoOptions(answer="call {n}", fail_ids=(refused,))
    rows = [make_row(record=t.to_json()) for t in trajs]
    first_run = backend.run

    async def scripted(requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
        if backend.calls:  # from the second batch on, a usable verdict
            backend.options = EchoOptions(answer=answer, fail_ids=(refused,))
        async for result in first_run(requests):
            yield result

    backend.run = scripted  # type: ignore[method-assign]
    out = asyncio.run(_run(stage, rows))
    assert [len(c) for c in backend.calls] == [4, 3]  # the refused one is not asked again
    assert out[0]["status"] == "failed" and out[0]["reason"] == "llm_bad_request"
    assert [r["status"] for r in out[1:]] == ["ok"] * 3
    assert all(
        json.loads(r["retries"]) == {"llm_rate_limited": 2, "unparsable_completion": 1}
        for r in out[1:]
    )
    assert all(r["cost_usd"] == 0.5 for r in out[1:])  # both answers paid and counted


def test_a_backend_that_drops_a_request_fails_that_row_only(echo: None, tmp_path: Path) -> None:

    class Lossy(EchoBackend):
        async def run(self, requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
            async for result in super().run(requests[1:]):
                yield result

    register_backend(BackendPlugin("echo", EchoOptions, Lossy), replace=True)
    stage = amplify_stage(cfg_for(tmp_path, "llm.backend=echo", "cache.enabled=false"), seeds(2))
    out = asyncio.run(
        _run(stage, [{"status": "ok", "call_index": i, "id": None} for i in range(3)])
    )
    assert sorted(r["status"] for r in out) == ["failed", "ok", "ok"]
    (lost,) = [r for r in out if r["status"] == "failed"]
    assert lost["reason"] == "llm_server_error" and "returned no result" in lost["message"]
