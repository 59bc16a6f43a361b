"""Anthropic's and Gemini's batch backends against the development server (no Ray).

The lifecycle is one (``factory.llm.backends.batching``); these tests prove it holds on
each provider's wire, against the devserver's Message Batches and Batch API (which
schedule delays, errors, expiry and cancellation as the OpenAI Batch API's do): batches
split, submitted, polled and mapped back at the batch price; a batch that expires or is
cancelled keeps the answers it has and the rest is submitted again; a per-request error
is submitted again within the retry policy; a backend that dies while its batch runs is
replaced by one that re-attaches (same journal) and submits nothing twice, also when the
creation was never recorded. The server's request log is the witness. The real kill -9 of
a driver mid-batch is proven once for the shared lifecycle, by ``tests/e2e/test_batch.py``
(OpenAI's wire).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from factory.errors import LLMError
from factory.io.runstate import BatchJournal, batch_summary
from factory.llm.backends import LLMRequest
from factory.llm.backends.anthropic_batch import AnthropicBatchBackend, AnthropicBatchOptions
from factory.llm.backends.batching import BatchLifecycle
from factory.llm.backends.gemini_batch import GeminiBatchBackend, GeminiBatchOptions
from factory.llm.pricing import PriceTable
from tests.llm.backends.batchkit import answered, collect, ends, log_lines, requests, submitted

POLL = {"poll_interval_s": 0.05, "poll_backoff": 1.2, "poll_max_s": 0.3}
PRICE = PriceTable().lookup_batch("gpt-5")  # any Batch-tier price: answers are priced by it


def _anthropic(url: str, journal: Any = None, **options: Any) -> BatchLifecycle:
    return AnthropicBatchBackend(
        base_url=url,
        api_key="unused",
        model="factory-dev",
        sampling={},
        price=PRICE,
        options=AnthropicBatchOptions(**{**POLL, **options}),
        max_submissions=4,
        journal=journal,
    )


def _anthropic_cancel(url: str, batch_id: str) -> tuple[str, dict[str, str]]:
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
    return f"{url}/messages/batches/{batch_id}/cancel", headers


def _gemini(url: str, journal: Any = None, **options: Any) -> BatchLifecycle:
    return GeminiBatchBackend(
        base_url=url,
        api_key="unused",
        model="factory-dev",
        sampling={},
        price=PRICE,
        options=GeminiBatchOptions(**{**POLL, **options}),
        max_submissions=4,
        journal=journal,
    )


def _gemini_cancel(url: str, batch_id: str) -> tuple[str, dict[str, str]]:
    base = url.rsplit("/v1", 1)[0]
    return f"{base}/v1beta/{batch_id}:cancel", {"x-goog-api-key": "unused"}


Make = Callable[..., BatchLifecycle]
PROVIDERS: dict[str, tuple[Make, Callable[[str, str], tuple[str, dict[str, str]]], str]] = {
    "anthropic": (_anthropic, _anthropic_cancel, "max_requests_per_batch"),
    "gemini": (_gemini, _gemini_cancel, "max_requests_per_batch"),
}


@pytest.fixture(params=sorted(PROVIDERS))
def provider(request: pytest.FixtureRequest) -> tuple[Make, Any, str]:
    return PROVIDERS[request.param]


def test_batches_are_split_submitted_polled_and_mapped_back(devserver, tmp_path, provider) -> None:
    make, _, per_batch = provider
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.3, request_log=str(log))
    backend = make(server.url, BatchJournal(tmp_path / "out"), **{per_batch: 3})
    reqs = requests(7)
    results = asyncio.run(collect(backend, reqs))
    assert set(results) == {r.request_id for r in reqs}
    for result in results.values():
        assert result.completion is not None and result.completion.text
        assert result.completion.cost_usd > 0 and result.completion.attempts == 1
        assert result.completion.usage.input > 0 and result.completion.usage.output > 0
    summary = batch_summary(tmp_path / "out")
    assert summary is not None and summary["count"] == 3
    assert summary["by_status"] == {"completed": 3} and summary["requests_completed"] == 7
    lines = log_lines(log)
    assert submitted(lines) == Counter({r.request_id: 1 for r in reqs})
    assert answered(lines) == Counter({r.request_id: 1 for r in reqs})
    assert backend.totals()["batches"] == 3 and backend.totals()["calls"] == 7


def test_an_expired_batch_keeps_its_answers_and_the_rest_is_submitted_again(
    devserver, tmp_path, provider
) -> None:
    make, _, _ = provider
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.3, batch_expire_first=1, batch_expire_keep=0.5,
                       request_log=str(log))  # fmt: skip
    reqs = requests(10)
    results = asyncio.run(collect(make(server.url), reqs))
    assert all(r.completion is not None for r in results.values())
    lines = log_lines(log)
    assert ends(lines) == ["expired", "completed"]
    # the five answered before expiry were kept, the other five submitted once more
    assert sorted(submitted(lines).values()) == [1] * 5 + [2] * 5
    assert answered(lines) == Counter({r.request_id: 1 for r in reqs})


def test_per_request_errors_are_submitted_again_within_the_retry_policy(
    devserver, tmp_path, provider
) -> None:
    make, _, _ = provider
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.2, batch_error_rate=0.4, request_log=str(log), seed=3)
    reqs = requests(20)
    results = asyncio.run(collect(make(server.url), reqs))
    lines = log_lines(log)
    assert any(r.get("status") == 500 for r in lines), "the server injected no error"
    assert set(results) == {r.request_id for r in reqs}
    ok = {rid for rid, r in results.items() if r.completion is not None}
    assert len(ok) >= 17  # 4 submissions at 40%: nearly all get through
    for rid, result in results.items():
        if rid not in ok:  # a failed row with its reason, after the policy's submissions
            assert isinstance(result.error, LLMError) and "500" in str(result.error)
            assert getattr(result.error, "attempts", None) == 4
    assert max(answered(lines).values()) == 1 and max(submitted(lines).values()) > 1


def test_a_failed_batch_fails_its_rows_after_the_retry_policy(devserver, tmp_path, provider):
    make, _, _ = provider
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.1, batch_fail_first=100, request_log=str(log))
    results = asyncio.run(collect(make(server.url), requests(3)))
    for result in results.values():
        assert isinstance(result.error, LLMError) and result.error.retryable
        assert getattr(result.error, "attempts", None) == 4
    assert Counter(ends(log_lines(log))) == {"failed": 4}


async def _watch_then(backend: BatchLifecycle, until: Callable[[list[dict[str, Any]]], bool],
                      then: Callable[[list[dict[str, Any]]], Any]) -> None:  # fmt: skip
    """Wait until the journal shows ``until``, then await ``then(entries)``."""
    for _ in range(3000):
        entries = backend.journal.load()
        if until(entries):
            await then(entries)
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the journal never showed the batches")


def test_a_cancelled_batch_keeps_its_answers_and_the_rest_is_submitted_again(
    devserver, tmp_path, provider
) -> None:
    make, cancel_call, _ = provider
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=1.5, request_log=str(log))
    backend = make(server.url)
    reqs = requests(8)

    async def cancel_first(entries: list[dict[str, Any]]) -> None:
        url, headers = cancel_call(server.url, entries[0]["batch_id"])
        async with aiohttp.ClientSession() as http, http.post(url, headers=headers) as resp:
            assert resp.status == 200

    async def go() -> dict[str, Any]:
        watcher = asyncio.ensure_future(_watch_then(
            backend,
            lambda es: bool(es) and es[0].get("batch_id") is not None
            and any(r.get("kind") == "batch" for r in log_lines(log)),
            cancel_first,
        ))  # fmt: skip
        results = await collect(backend, reqs)
        await watcher
        return results

    results = asyncio.run(go())
    assert all(r.completion is not None for r in results.values())
    lines = log_lines(log)
    assert ends(lines)[0] == "cancelled" and ends(lines)[-1] == "completed"
    again = [rid for rid, n in submitted(lines).items() if n == 2]
    assert again and len(again) < len(reqs)  # the answered ones were kept
    assert answered(lines) == Counter({r.request_id: 1 for r in reqs})


async def _run_until_created(backend: BatchLifecycle, reqs: list[LLMRequest], n: int) -> None:
    """Start ``run`` and drop it (as a killed driver does) once its ``n`` batches exist."""
    agen = backend.run(reqs)
    task = asyncio.ensure_future(agen.__anext__())

    async def nothing(_: Any) -> None:
        return None

    await _watch_then(
        backend, lambda es: len(es) == n and all(e.get("batch_id") for e in es), nothing
    )
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    await backend.aclose()


@pytest.mark.parametrize("unconfirmed", [False, True])
def test_a_restarted_backend_reattaches_and_submits_nothing_twice(
    devserver, tmp_path, provider, unconfirmed: bool
) -> None:
    make, _, per_batch = provider
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=1.0, request_log=str(log))
    journal = BatchJournal(tmp_path / "out")
    reqs = requests(6)
    first = make(server.url, journal, **{per_batch: 3})
    asyncio.run(_run_until_created(first, reqs, 2))
    assert not any(r.get("kind") == "batch_end" for r in log_lines(log)), "too late: ended"
    if unconfirmed:  # the driver died between creating a batch and recording its id
        entry = journal.load()[0]
        journal.save({**entry, "batch_id": None, "status": "submitting"})
    second = make(server.url, journal, **{per_batch: 3})
    watched: Counter[str] = Counter()
    results_of = second._results

    async def counted(entry: dict[str, Any]) -> Any:
        watched[entry["key"]] += 1
        return await results_of(entry)

    second._results = counted  # type: ignore[method-assign]
    results = asyncio.run(collect(second, reqs))
    assert sorted(watched.values()) == [1, 1]  # each batch watched once
    assert all(r.completion is not None for r in results.values())
    lines = log_lines(log)
    assert submitted(lines) == Counter({r.request_id: 1 for r in reqs})
    assert answered(lines) == Counter({r.request_id: 1 for r in reqs})
    assert len({e["batch_id"] for e in journal.load()}) == 2


@pytest.mark.parametrize(
    ("backend", "model", "cls"),
    [
        ("anthropic_batch", "claude-sonnet-4-5", AnthropicBatchBackend),
        ("gemini_batch", "gemini-2.5-flash", GeminiBatchBackend),
    ],
)
def test_a_batch_backend_takes_one_endpoint_naming_the_key(
    tmp_path, monkeypatch, backend: str, model: str, cls: type
) -> None:
    import json

    from factory.engine.stages.llm_stage import build_backend_for
    from factory.errors import ConfigError
    from factory.recipe import load_recipe
    from tests.conftest import ROOT
    from tests.helpers import stage_settings

    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    two = [{"base_url": "http://127.0.0.1:9/v1"}, {"base_url": "http://127.0.0.1:10/v1"}]

    def cfg(endpoints: list[dict[str, str]]) -> Any:
        return load_recipe(ROOT / "pipelines" / "airline.yaml", [
            f"output.dir={tmp_path}", f"llm.backend={backend}", f"llm.model={model}",
            f"llm.endpoints={json.dumps(endpoints)}"])  # fmt: skip

    with pytest.raises(ConfigError) as info:
        build_backend_for(stage_settings(cfg(two), model=model))
    assert info.value.key_path == "llm.endpoints" and "one endpoint" in str(info.value)
    assert isinstance(build_backend_for(stage_settings(cfg(two[:1]), model=model)), cls)
