"""The ``anthropic_batch`` wire, pure: request lines, custom ids, limits, batch states and
result lines of every type.

The provider's shapes are fixtures written from Anthropic's documentation and SDK
(``tests/fixtures/providers/anthropic/batch``, sources in its README): every
``MessageBatch`` there goes through :func:`batch_state`, the results file through the
backend's own ``_read``, the listing through ``_find`` and the create call's body is
compared with the documented one.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime
from typing import Any

import pytest

from factory.errors import LLMBadRequest, LLMError, LLMRateLimited, LLMServerError
from factory.llm.backends import get_backend
from factory.llm.backends.anthropic import ANTHROPIC_VERSION, DEFAULT_ENDPOINT
from factory.llm.backends.anthropic_batch import (
    AnthropicBatchBackend,
    AnthropicBatchOptions,
    batch_state,
    custom_id,
    parse_result_line,
    unclaimed_match,
)
from factory.llm.backends.batching import LIVE, TERMINAL, split_requests
from factory.llm.types import Completion, ToolCall, Usage
from tests.conftest import ROOT
from tests.llm.backends.batchkit import answering, requests

ENDPOINT = "api.anthropic.com"
FIXTURES = ROOT / "tests/fixtures/providers/anthropic/batch"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def result_lines() -> dict[str, dict[str, Any]]:
    """The documented results file's lines by custom id."""
    lines = (json.loads(raw) for raw in (FIXTURES / "results.jsonl").read_text().splitlines())
    return {line["custom_id"]: line for line in lines}


def _backend(**options: object) -> AnthropicBatchBackend:
    return AnthropicBatchBackend(
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-ant-test",
        model="claude-sonnet-4-5",
        sampling={"temperature": 1.0, "max_completion_tokens": 2000},
        price=None,
        options=AnthropicBatchOptions(**options),  # type: ignore[arg-type]
        max_submissions=3,
    )


def test_a_request_line_is_a_custom_id_and_the_messages_body_with_its_prefix_marked() -> None:
    backend = _backend()
    line = json.loads(backend._line(requests(1)[0], "r-0"))
    assert set(line) == {"custom_id", "params"} and line["custom_id"] == "r-0"
    params = line["params"]
    assert params["model"] == "claude-sonnet-4-5" and params["max_tokens"] == 2000
    assert params["temperature"] == 1.0
    # the static system block is marked: batches and prompt caching stack
    assert params["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert params["messages"] == [{"role": "user", "content": "say hello number 0"}]
    headers = {"x-api-key": "sk-ant-test", "anthropic-version": ANTHROPIC_VERSION}
    assert backend._headers() == headers


def test_custom_ids_are_valid_deterministic_and_distinct() -> None:
    valid = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
    assert custom_id("amplify-0123abcd") == "amplify-0123abcd"  # the factory's ids pass as-is
    odd = ["judge:seed/1 v2", "x" * 100, "é" * 70, "judge:seed/1 v3"]
    mapped = [custom_id(r) for r in odd]
    assert all(valid.match(c) for c in mapped)
    assert len(set(mapped)) == len(odd)
    assert mapped == [custom_id(r) for r in odd]  # a restarted run maps them the same way


def test_limits_split_batches_by_count_and_by_bytes() -> None:
    backend = _backend(max_requests_per_batch=2, max_batch_mb=0.004)
    lines = [backend._line(r, r.request_id) for r in requests(5)]
    count, size = backend._limits()
    assert count == 2 and size < 4000
    groups = split_requests(lines, count, size)
    assert [i for g in groups for i in g] == list(range(5))
    for g in groups:
        body = b'{"requests":[' + b",".join(lines[i] for i in g) + b"]}"
        assert len(g) <= 2 and len(body) <= 4000
    with pytest.raises(ValueError):  # the API's own limits are the options' bounds
        AnthropicBatchOptions(max_requests_per_batch=100_001)
    with pytest.raises(ValueError):
        AnthropicBatchOptions(max_batch_mb=257)


def test_the_documented_create_body_is_what_the_backend_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    documented = fixture("create_request.json")
    created = fixture("batch_in_progress.json")["body"]
    backend = _backend()
    calls = answering(backend, monkeypatch, created)
    lines = [backend._line(r, r.request_id) for r in requests(2)]
    state = asyncio.run(backend._create({"key": "k"}, lines))
    ((method, path, kw),) = calls
    assert (method, path) == ("POST", "/messages/batches")
    assert kw["headers"] == {"content-type": "application/json"}
    sent = json.loads(kw["data"])
    assert set(sent) == set(documented)
    for ours, theirs in zip(sent["requests"], documented["requests"], strict=True):
        assert set(ours) == set(theirs)  # custom_id, params
        assert set(theirs["params"]) <= set(ours["params"])  # model, max_tokens, messages
    assert [r["custom_id"] for r in sent["requests"]] == ["r-0", "r-1"]
    assert state is not None
    assert state.batch_id == created["id"] and state.status == "in_progress"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("batch_*.json")))
def test_documented_batches_in_neutral_words(name: str) -> None:
    case = fixture(name)
    body, expect = case["body"], case["expect"]
    state = batch_state(body)
    assert state.batch_id == body["id"]
    assert state.status == expect["status"] and state.status in LIVE + TERMINAL
    assert state.counts == expect["counts"]
    assert state.fields == {
        "provider_status": body["processing_status"],
        "results_url": body["results_url"],
        "expires_at": body["expires_at"],
        "created_at": body["created_at"],
    }
    if expect["error"] is None:
        assert state.error is None
    else:  # an ended batch that did not run everything says why
        assert expect["error"] in str(state.error)


def test_the_documented_results_file_maps_every_result_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended = fixture("batch_ended.json")["body"]
    backend = _backend()
    calls = answering(backend, monkeypatch, (FIXTURES / "results.jsonl").read_bytes())
    entry = {"batch_id": ended["id"], **batch_state(ended).fields}
    got = asyncio.run(backend._read(entry))
    # the results are read from the batch's results_url, which is on the API's own host
    assert [(m, p, kw) for m, p, kw in calls] == [("GET", ended["results_url"], {"raw": True})]
    official = AnthropicBatchBackend(
        base_url=DEFAULT_ENDPOINT.base_url, api_key="k", model="m", sampling={}, price=None,
        options=AnthropicBatchOptions(), max_submissions=1,
    )  # fmt: skip
    assert official._url(ended["results_url"]) == ended["results_url"]
    assert set(got) == set(result_lines())

    text = got["my-second-request"]  # a cache read, billed at the batch tier
    assert isinstance(text, Completion) and text.text.startswith("Hello again")
    assert text.finish_reason == "stop" and text.reasoning is None
    assert text.usage == Usage(input=11 + 5843, cached_input=5843, output=36)

    tool = got["my-first-request"]  # thinking, text and a tool call; a cache write
    assert isinstance(tool, Completion) and tool.finish_reason == "tool_calls"
    assert tool.reasoning is not None and tool.reasoning.startswith("The reservation id")
    assert tool.text == "I'll look up the reservation first."
    assert tool.tool_calls == (
        ToolCall("toolu_01A09q90qw90lq917835lq9", "get_reservation_details",
                 json.dumps({"reservation_id": "ZFA04Y"})),
    )  # fmt: skip
    assert tool.usage == Usage(input=21 + 5843, cache_write=5843, output=140)

    bad = got["my-third-request"]  # its error response nested as the SDK's ErrorResponse
    assert isinstance(bad, LLMBadRequest) and not bad.retryable  # fixing it takes a new request
    assert "invalid_request_error" in str(bad) and "max_tokens: Field required" in str(bad)
    for cid, kind in (("my-fourth-request", "canceled"), ("my-fifth-request", "expired")):
        err = got[cid]
        assert isinstance(err, LLMServerError) and err.retryable  # not run: submitted again
        assert kind in str(err)


@pytest.mark.parametrize(
    ("etype", "kind", "retryable"),
    [
        ("overloaded_error", LLMServerError, True),
        ("api_error", LLMServerError, True),
        ("rate_limit_error", LLMRateLimited, True),
        ("authentication_error", LLMBadRequest, False),
        ("an_error_type_not_yet_known", LLMServerError, True),
    ],
)
def test_an_errored_result_is_retried_as_its_error_type_says(
    etype: str, kind: type[LLMError], retryable: bool
) -> None:
    line = result_lines()["my-third-request"]
    line["result"]["error"]["error"]["type"] = etype
    cid, got = parse_result_line(line, ENDPOINT, "m")
    assert cid == "my-third-request" and isinstance(got, kind)
    assert got.retryable is retryable and etype in str(got)


def test_a_line_of_an_unknown_result_type_is_a_failure_not_a_crash() -> None:
    _, got = parse_result_line({"custom_id": "c", "result": {"type": "vanished"}}, ENDPOINT, "m")
    assert isinstance(got, LLMServerError) and "unknown result type" in str(got)


def test_a_batch_never_recorded_is_found_in_the_documented_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listing = fixture("list.json")
    mine = listing["data"][0]
    made = datetime.fromisoformat(mine["created_at"].replace("Z", "+00:00")).timestamp()
    entry = {"request_ids": ["a", "b"], "submitted_at": made - 2.0}
    backend = _backend()
    calls = answering(backend, monkeypatch, listing, listing)
    found = asyncio.run(backend._find(entry, claimed=set()))
    assert found is not None and found.batch_id == mine["id"] and found.status == "in_progress"
    assert calls[0][:2] == ("GET", "/messages/batches")
    assert asyncio.run(backend._find(entry, claimed={mine["id"]})) is None  # claimed: not ours


def test_a_batch_never_recorded_is_found_by_size_and_creation_time() -> None:
    def made(bid: str, n: int, at: str) -> dict[str, object]:
        return {"id": bid, "created_at": at, "request_counts": {"processing": n}}

    t0 = 1_724_179_044.0  # 2024-08-20T18:37:24Z
    listing = [
        made("b-other-size", 4, "2024-08-20T18:37:25Z"),
        made("b-claimed", 3, "2024-08-20T18:37:24Z"),
        made("b-late", 3, "2024-08-20T19:37:24Z"),
        made("b-mine", 3, "2024-08-20T18:37:26Z"),
    ]
    found = unclaimed_match(listing, 3, t0, claimed={"b-claimed"})
    assert found is not None and found["id"] == "b-mine"
    assert unclaimed_match(listing, 5, t0, claimed=set()) is None


def test_the_backend_is_discovered_and_batched() -> None:
    plugin = get_backend("anthropic_batch")
    assert plugin.batched and plugin.cache is not None and plugin.cache.marked


def test_request_ids_anthropic_refuses_travel_under_mapped_ids_kept_in_the_journal(
    devserver,
) -> None:
    import asyncio

    from factory.llm.backends import LLMRequest
    from tests.llm.backends.batchkit import collect

    server = devserver(batch_delay_s=0.1)
    backend = AnthropicBatchBackend(
        base_url=server.url, api_key="unused", model="factory-dev", sampling={}, price=None,
        options=AnthropicBatchOptions(poll_interval_s=0.05, poll_max_s=0.2), max_submissions=2,
    )  # fmt: skip
    ids = ["judge:seed/1 v2", "judge:seed/2 v2"]
    reqs = [LLMRequest.of(rid, [{"role": "user", "content": rid}]) for rid in ids]
    results = asyncio.run(collect(backend, reqs))
    assert sorted(results) == ids and all(r.completion is not None for r in results.values())
    (entry,) = backend.journal.load()
    assert entry["request_ids"] == ids and entry["custom_ids"] == [custom_id(i) for i in ids]
