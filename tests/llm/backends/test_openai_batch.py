"""The ``openai_batch`` backend against the development server's Batch API (no Ray).

Files are uploaded, batches created, polled, their output and error files mapped back
by ``custom_id``; split beyond the per-file limits; per-request errors, expiry and a
failed batch are handled per the retry policy; a backend that dies while its batches
run is replaced by one that re-attaches to them (same journal) and submits nothing
twice. The server's request log is the witness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from factory.errors import LLMError
from factory.io.runstate import BatchJournal, batch_summary
from factory.llm.backends import LLMRequest, LLMResult
from factory.llm.backends.openai_batch import (
    BatchBackend,
    BatchOptions,
    MemoryJournal,
    split_requests,
)
from factory.llm.pricing import DEFAULT_PRICES, PriceTable
from tests.helpers import amplify_stage, stage_settings


def _requests(n: int, tag: str = "r") -> list[LLMRequest]:
    return [
        LLMRequest.of(f"{tag}-{i}", [{"role": "user", "content": f"say hello number {i}"}])
        for i in range(n)
    ]


def _backend(url: str, journal: Any = None, **options: Any) -> BatchBackend:
    opts = {"poll_interval_s": 0.05, "poll_backoff": 1.2, "poll_max_s": 0.3, **options}
    return BatchBackend(
        base_url=url,
        api_key="unused",
        model="factory-dev",
        sampling={},
        price=PriceTable().lookup_batch("gpt-5"),
        options=BatchOptions(**opts),
        max_submissions=4,
        journal=journal,
    )


async def _collect(backend: BatchBackend, requests: list[LLMRequest]) -> dict[str, LLMResult]:
    out: dict[str, LLMResult] = {}
    try:
        async for result in backend.run(requests):
            assert result.request_id not in out, "a request got two results"
            out[result.request_id] = result
    finally:
        await backend.aclose()
    return out


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _run_stage(stage: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drive an LLM stage's rows as its actor would, then close its sessions and cache."""
    try:
        return list(await stage.arun_rows([dict(r) for r in rows]))
    finally:
        await stage.backend.aclose()
        if stage.cache is not None:
            stage.cache.close()


def _answered(log: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["request_id"] for r in log if r.get("kind") == "batch" and r["completed"])


def _submitted(log: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["request_id"] for r in log if r.get("kind") == "batch_submit")


def test_split_requests_keeps_both_limits() -> None:
    lines = [b"x" * 9 for _ in range(7)]  # 10 bytes each with the newline
    assert split_requests(lines, 3, 1000) == [[0, 1, 2], [3, 4, 5], [6]]
    assert split_requests(lines, 100, 25) == [[0, 1], [2, 3], [4, 5], [6]]
    with pytest.raises(ValueError):
        split_requests([b"y" * 50], 10, 20)


def test_batch_prices_are_half_the_online_rate_for_gpt5_and_o4_mini() -> None:
    table = PriceTable()
    for model in ("gpt-5", "o4-mini"):
        online, batch = DEFAULT_PRICES[model], table.lookup_batch(model)
        assert batch is not None
        assert batch.input_per_mtok == online.input_per_mtok / 2
        assert batch.output_per_mtok == online.output_per_mtok / 2
    recipe = PriceTable.from_config(
        {
            "mine": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "batch_share": 0.5},
            "gpt-5": {"input_per_mtok": 1.0, "output_per_mtok": 9.0},
        }
    )
    mine = recipe.lookup_batch("mine")
    assert mine is not None and (mine.input_per_mtok, mine.output_per_mtok) == (1.0, 4.0)
    overridden = recipe.lookup_batch("gpt-5")  # a listed model: the Batch tier's share
    assert overridden is not None and overridden.output_per_mtok == 4.5
    plain = PriceTable.from_config({"local": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}})
    unlisted = plain.lookup_batch("local")  # no discount nobody stated
    assert unlisted is not None and unlisted.output_per_mtok == 2.0


def test_batches_are_split_submitted_polled_and_mapped_back(devserver, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.3, request_log=str(log))
    journal = BatchJournal(tmp_path / "out")
    backend = _backend(server.url, journal, max_requests_per_file=3)
    requests = _requests(7)
    results = asyncio.run(_collect(backend, requests))
    assert set(results) == {r.request_id for r in requests}
    for result in results.values():
        assert result.completion is not None and result.completion.text
        assert result.completion.cost_usd > 0  # priced at the batch rate
    usage = results["r-0"].completion.usage  # type: ignore[union-attr]
    batch_price = PriceTable().lookup_batch("gpt-5")
    assert batch_price is not None
    assert usage.input > 0 and usage.output > 0
    expected = (
        (usage.input - usage.cached_input) * batch_price.input_per_mtok
        + usage.cached_input * batch_price.cached_input_per_mtok
        + usage.output * batch_price.output_per_mtok
    ) / 1e6
    assert results["r-0"].completion.cost_usd == pytest.approx(expected)  # type: ignore[union-attr]
    summary = batch_summary(tmp_path / "out")
    assert summary is not None
    assert summary["count"] == 3 and summary["by_status"] == {"completed": 3}
    assert summary["requests_submitted"] == 7 and summary["requests_completed"] == 7
    assert all(b["id"].startswith("batch_") for b in summary["batches"])
    lines = _log(log)
    assert _submitted(lines) == Counter({r.request_id: 1 for r in requests})
    assert _answered(lines) == Counter({r.request_id: 1 for r in requests})


def test_per_request_errors_are_submitted_again(devserver, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.2, batch_error_rate=0.4, request_log=str(log), seed=3)
    backend = _backend(server.url)
    requests = _requests(20)
    results = asyncio.run(_collect(backend, requests))
    lines = _log(log)
    assert any(r.get("status") == 500 for r in lines), "the server injected no error"
    ok = {rid for rid, r in results.items() if r.completion is not None}
    # Errors are drawn per attempt: with 4 submissions at 40%, nearly all get through.
    assert len(ok) >= 17
    assert set(results) == {r.request_id for r in requests}
    assert max(_answered(lines).values()) == 1
    assert max(_submitted(lines).values()) > 1  # errored ones went into a new batch


def test_expired_batch_keeps_its_partial_results(devserver, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(
        batch_delay_s=0.3, batch_expire_first=1, batch_expire_keep=0.5, request_log=str(log)
    )
    backend = _backend(server.url)
    requests = _requests(10)
    results = asyncio.run(_collect(backend, requests))
    assert all(r.completion is not None for r in results.values())
    lines = _log(log)
    ends = [r["status"] for r in lines if r.get("kind") == "batch_end"]
    assert ends == ["expired", "completed"]
    submitted = _submitted(lines)
    # the five answered before expiry were kept, the other five submitted once more
    assert sorted(submitted.values()) == [1] * 5 + [2] * 5
    assert _answered(lines) == Counter({r.request_id: 1 for r in requests})


def test_failed_batches_fail_their_rows_after_the_retry_policy(devserver, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.1, batch_fail_first=100, request_log=str(log))
    backend = _backend(server.url)
    results = asyncio.run(_collect(backend, _requests(3)))
    for result in results.values():
        assert isinstance(result.error, LLMError) and result.error.retryable
        assert "ended failed" in str(result.error)
        assert getattr(result.error, "attempts", None) == 4
    assert Counter(r["status"] for r in _log(log) if r.get("kind") == "batch_end") == {"failed": 4}


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def _run_until_submitted(backend: BatchBackend, requests: list[LLMRequest]) -> None:
    """Start ``run`` and drop it (as a killed driver does) once its batches exist."""
    agen = backend.run(requests)
    task = asyncio.ensure_future(agen.__anext__())
    journal = backend.journal
    for _ in range(2000):
        entries = journal.load()
        if entries and all(e.get("batch_id") for e in entries) and len(entries) == 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    await backend.aclose()


@pytest.mark.parametrize("unconfirmed", [False, True])
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_a_restarted_backend_reattaches_and_submits_nothing_twice(
    devserver, tmp_path, unconfirmed: bool
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=2.0, request_log=str(log))
    journal = BatchJournal(tmp_path / "out")
    requests = _requests(6)
    first = _backend(server.url, journal, max_requests_per_file=3)
    asyncio.run(_run_until_submitted(first, requests))
    assert len(journal.load()) == 2
    if unconfirmed:  # the driver died between creating a batch and recording its id
        entry = journal.load()[0]
        journal.save({**entry, "batch_id": None, "status": "submitting"})
    second = _backend(server.url, journal, max_requests_per_file=3)
    watched: Counter[str] = Counter()
    results_of = second._results

    async def counted(entry: dict[str, Any]) -> Any:
        watched[entry["key"]] += 1
        return await results_of(entry)

    second._results = counted  # type: ignore[method-assign]
    results = asyncio.run(_collect(second, requests))
    assert sorted(watched.values()) == [1, 1]  # each batch watched once, not once per request
    assert all(r.completion is not None for r in results.values())
    lines = _log(log)
    assert _submitted(lines) == Counter({r.request_id: 1 for r in requests})
    assert _answered(lines) == Counter({r.request_id: 1 for r in requests})
    assert len({e["batch_id"] for e in journal.load()}) == 2


def test_memory_journal_is_used_without_an_output_folder(devserver) -> None:
    server = devserver(batch_delay_s=0.1)
    backend = _backend(server.url)
    results = asyncio.run(_collect(backend, _requests(2)))
    assert all(r.completion is not None for r in results.values())
    assert isinstance(backend.journal, MemoryJournal)
    assert [e["status"] for e in backend.journal.load()] == ["completed"]


def test_progress_line_shows_batches_by_state_and_requests_done(tmp_path) -> None:
    from factory.engine.jobs.amplify import batch_line

    journal = BatchJournal(tmp_path)
    assert batch_line(batch_summary(tmp_path)) is None  # no batch: no line
    for key, status, done in (("a", "completed", 3), ("b", "in_progress", 1), ("c", "expired", 1)):
        journal.save(
            {"key": key, "batch_id": f"batch_{key}", "status": status, "request_ids": ["x"] * 3,
             "request_counts": {"total": 3, "completed": done, "failed": 2 if key == "c" else 0}}
        )  # fmt: skip
    assert batch_line(batch_summary(tmp_path)) == (
        "batches: 1 completed, 1 expired, 1 in_progress; requests 5/9 done, 2 failed"
    )


def test_the_real_amplify_stage_runs_on_batches_and_a_rerun_replays_the_cache(
    devserver, tmp_path
) -> None:
    """The same stage (render, cache, record) as the online path; only the call differs.
    No Ray: the stage is driven directly, as an actor would."""
    from factory.core.formats import parse_record
    from factory.recipe import load_recipe
    from tests.conftest import ROOT

    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.3, request_log=str(log))
    cfg = load_recipe(
        ROOT / "pipelines" / "airline-batch.yaml",
        [
            f"output.dir={tmp_path / 'out'}",
            "amplify.max_cost_usd=null",  # no budget actor (no Ray here)
            "llm.endpoints=" + json.dumps([{"base_url": server.url}]),
            "llm.backend_options={poll_interval_s: 0.05, poll_max_s: 0.3}",
        ],
    )
    lines = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[:3]
    kept = {}
    for i, line in enumerate(lines):
        traj = parse_record(json.loads(line), source=f"s:{i}")
        kept[traj.id] = traj.to_json()
    rows = [{"status": "ok", "call_index": i, "id": None} for i in range(6)]

    out = asyncio.run(_run_stage(amplify_stage(cfg, kept), rows))
    assert [r["status"] for r in out] == ["ok"] * 6
    assert all(r["completion"] and r["cached"] is False and r["paid_usd"] > 0 for r in out)
    summary = batch_summary(tmp_path / "out")
    assert summary is not None and summary["count"] == 1  # one actor's rows: one batch
    assert summary["by_status"] == {"completed": 1}
    again = asyncio.run(_run_stage(amplify_stage(cfg, kept), rows))  # a rerun: all from the cache
    assert all(r["cached"] is True and r["paid_usd"] == 0.0 for r in again)
    assert batch_summary(tmp_path / "out")["count"] == 1  # type: ignore[index]
    assert sum(1 for r in _log(log) if r.get("kind") == "batch_submit") == 6


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_a_cost_cap_counts_batched_requests_when_they_are_submitted(devserver, tmp_path) -> None:
    """Batch answers come long after submission: each call reserves its estimated cost at
    the Batch price when the driver issues it, so a cap smaller than the whole batch stops
    issuing instead of being overshot by the batch in flight; answers settle it."""
    from factory.core.formats import parse_record
    from factory.engine.jobs.amplify import batch_reservation
    from factory.engine.ledger import Caps, Ledger
    from factory.engine.settings import amplify_prompt
    from factory.engine.stages.amplify import amplify_template
    from factory.envs.pack import load_domain
    from factory.recipe import load_recipe
    from tests.conftest import ROOT
    from tests.helpers import drive_calls

    log = tmp_path / "requests.jsonl"
    server = devserver(batch_delay_s=0.3, request_log=str(log))
    lines = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[:3]
    kept = {}
    for i, line in enumerate(lines):
        traj = parse_record(json.loads(line), source=f"s:{i}")
        kept[traj.id] = traj.to_json()

    def recipe(out: str, cap: float) -> Any:
        return load_recipe(
            ROOT / "pipelines" / "airline-batch.yaml",
            [
                f"output.dir={tmp_path / out}",
                f"amplify.max_cost_usd={cap}",
                "llm.sampling.max_completion_tokens=4000",
                "llm.endpoints=" + json.dumps([{"base_url": server.url}]),
                "llm.backend_options={poll_interval_s: 0.05, poll_max_s: 0.3}",
            ],
        )

    cfg = recipe("probe", 1000.0)
    template = amplify_template(amplify_prompt(cfg), load_domain(cfg.domain))
    estimate = batch_reservation(cfg, template, stage_settings(cfg))
    # At the price of gpt-5's Batch tier, the 4,000 output tokens dominate the estimate.
    assert estimate[0] > 4000 * 5.0 / 1e6 and estimate[1] > 4000
    free = Ledger(Caps(max_cost_usd=1000.0))
    rows = drive_calls(cfg, kept, 6, free, reserve=estimate)
    assert [r["status"] for r in rows] == ["ok"] * 6
    assert free.reserved_usd == pytest.approx(0.0, abs=1e-12)  # all settled
    assert 0 < free.cost_usd < 6 * estimate[0]  # real answers are shorter

    cap = 2.5 * estimate[0]  # room for two reservations at a time
    capped = Ledger(Caps(max_cost_usd=cap))
    before = {r["batch_id"] for r in _log(log) if r.get("kind") == "batch_submit"}
    rows = drive_calls(recipe("capped", cap), kept, 6, capped, reserve=estimate)
    assert capped.cost_usd <= cap and capped.reserved_usd == pytest.approx(0.0, abs=1e-12)
    batches = Counter(
        r["batch_id"]
        for r in _log(log)
        if r.get("kind") == "batch_submit" and r["batch_id"] not in before
    )
    # never more out at once than the cap has room for; as answers settle their real
    # (smaller) cost, the room comes back and the next calls go out
    assert batches and max(batches.values()) <= 2
    assert sum(batches.values()) == len(rows) and all(r["status"] == "ok" for r in rows)


def test_two_endpoints_are_refused_naming_the_key(tmp_path: Path) -> None:
    """The Batch API backend never ignores an endpoint the recipe lists: the run refuses
    to start (on the driver, before Ray) instead of sending everything to the first."""
    from factory.engine.stages.llm_stage import build_backend_for
    from factory.errors import ConfigError
    from factory.recipe import load_recipe
    from tests.conftest import ROOT

    two = [{"base_url": "http://127.0.0.1:9/v1"}, {"base_url": "http://127.0.0.1:10/v1"}]
    cfg = load_recipe(
        ROOT / "pipelines" / "airline.yaml",
        [f"output.dir={tmp_path}", "llm.backend=openai_batch", f"llm.endpoints={json.dumps(two)}"],
    )
    with pytest.raises(ConfigError) as info:
        build_backend_for(stage_settings(cfg, model="gpt-5"))
    assert info.value.key_path == "llm.endpoints" and "one endpoint" in str(info.value)
    one = load_recipe(
        ROOT / "pipelines" / "airline.yaml",
        [
            f"output.dir={tmp_path}",
            "llm.backend=openai_batch",
            f"llm.endpoints={json.dumps(two[:1])}",
        ],
    )
    assert isinstance(build_backend_for(stage_settings(one, model="gpt-5")), BatchBackend)
