"""The ``gemini_batch`` wire, pure: request lines, inline limits, batch states and the
inline results of every kind.

The provider's shapes are fixtures written from Google's documentation and SDK
(``tests/fixtures/providers/gemini/batch``, sources in its README): every Operation there
goes through :func:`batch_state`, the inline results through
:func:`parse_inlined_responses` and the backend's own ``_poll``/``_read``, the listing
through ``_find``, and the create call's body is compared with the guide's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from factory.devserver.gemini import normalize
from factory.errors import LLMBadRequest, LLMError, LLMRateLimited, LLMServerError
from factory.llm.backends import get_backend
from factory.llm.backends.batching import LIVE, TERMINAL, split_requests
from factory.llm.backends.gemini_batch import (
    GeminiBatchBackend,
    GeminiBatchOptions,
    batch_state,
    parse_inlined_responses,
)
from factory.llm.types import Completion, Usage
from tests.conftest import ROOT
from tests.llm.backends.batchkit import answering, requests

ENDPOINT = "generativelanguage.googleapis.com"
FIXTURES = ROOT / "tests/fixtures/providers/gemini/batch"
KEYS = ["request-1", "request-2"]


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _backend(**options: object) -> GeminiBatchBackend:
    return GeminiBatchBackend(
        base_url="http://127.0.0.1:9/v1",
        api_key="AIza-test",
        model="gemini-2.5-flash",
        sampling={"temperature": 1.0, "max_completion_tokens": 2000},
        price=None,
        options=GeminiBatchOptions(**options),  # type: ignore[arg-type]
        max_submissions=3,
    )


def test_a_request_line_is_the_generate_body_keyed_by_the_request_id() -> None:
    backend = _backend()
    assert backend.base_url == "http://127.0.0.1:9/v1beta"  # the Batch API's version, pinned
    assert backend._headers() == {"x-goog-api-key": "AIza-test"}  # never in the URL
    line = json.loads(backend._line(requests(1)[0], "r-0"))
    assert line["metadata"] == {"key": "r-0"}
    body = line["request"]
    assert "model" not in body  # it is in the path
    assert body["systemInstruction"]["parts"][0]["text"].startswith("You are the airline")
    assert body["contents"] == [{"role": "user", "parts": [{"text": "say hello number 0"}]}]
    assert body["generationConfig"] == {"temperature": 1.0, "maxOutputTokens": 2000}


def test_inline_batches_stay_under_the_size_limit() -> None:
    backend = _backend(max_batch_mb=0.004, max_requests_per_batch=10)
    lines = [backend._line(r, r.request_id) for r in requests(6)]
    count, size = backend._limits()
    assert count == 10 and size == 4000 - 1024
    groups = split_requests(lines, count, size)
    assert len(groups) > 1 and [i for g in groups for i in g] == list(range(6))
    assert all(sum(len(lines[i]) + 1 for i in g) + 1024 <= 4000 for g in groups)
    with pytest.raises(ValueError):  # Google takes 20 MB inline
        GeminiBatchOptions(max_batch_mb=21)


def test_the_guides_create_body_is_what_the_backend_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    # the guide writes field names in snake_case, the backend sends lowerCamelCase: Google's
    # JSON parser takes both (the devserver's ``normalize`` reads them as it does)
    documented = normalize(fixture("create_request"))["batch"]
    backend = _backend()
    calls = answering(backend, monkeypatch, fixture("operation_pending"))
    lines = [backend._line(r, r.request_id) for r in requests(2)]
    state = asyncio.run(backend._create({"key": "0f3c9a"}, lines))
    ((method, path, kw),) = calls
    assert (method, path) == ("POST", "/models/gemini-2.5-flash:batchGenerateContent")
    sent = json.loads(kw["data"])["batch"]
    assert set(sent) == set(documented) == {"displayName", "inputConfig"}
    assert sent["displayName"] == "factory-0f3c9a"
    ours = sent["inputConfig"]["requests"]["requests"]
    theirs = documented["inputConfig"]["requests"]["requests"]
    assert [set(i) for i in ours] == [set(i) for i in theirs] == [{"request", "metadata"}] * 2
    assert [i["metadata"] for i in ours] == [{"key": "r-0"}, {"key": "r-1"}]
    assert all(set(t["request"]) <= set(o["request"]) for o, t in zip(ours, theirs, strict=True))
    assert state is not None
    assert state.batch_id == "batches/123456" and state.status == "validating"


@pytest.mark.parametrize(
    ("name", "neutral", "counts", "why"),
    [
        ("operation_pending", "validating", (2, 0, 0), None),
        ("operation_running", "in_progress", (2, 1, 0), None),  # int64s come as strings
        ("operation_succeeded", "completed", (2, 1, 1), None),
        ("operation_failed", "failed", (2, 0, 0), "Internal error"),
        ("operation_cancelled", "cancelled", (2, 0, 0), "cancelled"),
        ("operation_expired", "expired", (2, 0, 0), None),
    ],
)
def test_documented_operations_in_neutral_words(
    name: str, neutral: str, counts: tuple[int, int, int], why: str | None
) -> None:
    operation = fixture(name)
    got = batch_state(operation)
    assert got.batch_id == operation["name"] == "batches/123456"
    assert got.status == neutral and got.status in (TERMINAL if operation.get("done") else LIVE)
    assert got.counts == dict(zip(("total", "completed", "failed"), counts, strict=True))
    assert got.fields == {
        "provider_status": operation["metadata"]["state"],
        "display_name": "my-batch-requests",
    }
    assert got.error == why or (why is not None and why in str(got.error))


@pytest.mark.parametrize(
    ("state", "neutral"),
    [
        ("JOB_STATE_PENDING", "validating"),  # the SDK's words for the same states
        ("JOB_STATE_RUNNING", "in_progress"),
        ("JOB_STATE_SUCCEEDED", "completed"),
        ("JOB_STATE_CANCELLED", "cancelled"),
        ("BATCH_STATE_UNSPECIFIED", "in_progress"),  # not done: still running
    ],
)
def test_the_sdks_state_words_are_read_too(state: str, neutral: str) -> None:
    operation = fixture("operation_running")
    operation["metadata"]["state"] = state
    assert batch_state(operation).status == neutral


def test_the_documented_inline_results_map_to_completions_and_errors() -> None:
    operation = fixture("operation_succeeded")
    got = parse_inlined_responses(operation, KEYS, ENDPOINT, "gemini-2.5-flash")
    assert set(got) == set(KEYS)
    ok = got["request-1"]
    assert isinstance(ok, Completion) and ok.finish_reason == "stop"
    assert ok.text.startswith("Photosynthesis turns light")
    assert ok.reasoning is not None and ok.reasoning.startswith("**Tracing the light")
    # cached tokens are part of the prompt's count; thoughts are output apart from candidates
    assert ok.usage == Usage(input=1300, cached_input=1024, output=15 + 80, reasoning=80)
    bad = got["request-2"]
    assert isinstance(bad, LLMBadRequest) and not bad.retryable  # INVALID_ARGUMENT
    assert "invalid argument" in str(bad)


@pytest.mark.parametrize("where", ["metadata.output", "response"])
def test_inline_results_are_read_where_either_the_sdk_or_the_rest_guide_reads_them(
    where: str,
) -> None:
    operation = fixture("operation_succeeded")
    if where == "response":  # the guide's REST example reads the Operation's response
        del operation["metadata"]["output"]
    else:  # the SDK reads metadata.output
        del operation["response"]
    got = parse_inlined_responses(operation, KEYS, ENDPOINT, "m")
    assert isinstance(got["request-1"], Completion) and isinstance(got["request-2"], LLMBadRequest)


def test_a_line_without_metadata_is_named_by_its_position() -> None:
    # Google returns the lines in request order; some answers were seen without their
    # metadata (https://discuss.ai.google.dev/t/112386)
    operation = fixture("operation_succeeded")
    lines = operation["metadata"]["output"]["inlinedResponses"]["inlinedResponses"]
    del lines[0]["metadata"]
    got = parse_inlined_responses(operation, ["r-0", "r-1"], ENDPOINT, "m")
    assert isinstance(got["r-0"], Completion) and isinstance(got["request-2"], LLMBadRequest)


@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [
        (3, LLMBadRequest, False),  # INVALID_ARGUMENT
        (8, LLMRateLimited, True),  # RESOURCE_EXHAUSTED
        (13, LLMServerError, True),  # INTERNAL
        (14, LLMServerError, True),  # UNAVAILABLE
        (None, LLMServerError, True),  # no code: taken as INTERNAL
    ],
)
def test_a_per_request_error_is_retried_as_its_code_says(
    code: int | None, kind: type[LLMError], retryable: bool
) -> None:
    operation = fixture("operation_succeeded")
    line = operation["metadata"]["output"]["inlinedResponses"]["inlinedResponses"][1]
    line["error"]["code"] = code
    got = parse_inlined_responses(operation, KEYS, ENDPOINT, "m")["request-2"]
    assert isinstance(got, kind) and got.retryable is retryable


@pytest.mark.parametrize("name", ["operation_expired", "operation_cancelled", "operation_failed"])
def test_a_batch_that_ended_early_answers_nothing_it_did_not_run(name: str) -> None:
    # no line: not answered (the lifecycle submits it again within the attempts)
    assert parse_inlined_responses(fixture(name), KEYS, ENDPOINT, "m") == {}


def test_an_ended_batch_is_read_from_the_poll_that_saw_it_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = _backend()
    done = fixture("operation_succeeded")
    calls = answering(backend, monkeypatch, fixture("operation_running"), done, done)
    entry = {"batch_id": "batches/123456", "request_ids": KEYS}
    assert asyncio.run(backend._poll(entry)).status == "in_progress"
    assert asyncio.run(backend._poll(entry)).status == "completed"
    got = asyncio.run(backend._read(entry))
    assert [c[:2] for c in calls] == [("GET", "/batches/123456")] * 2  # no second download
    assert isinstance(got["request-1"], Completion) and isinstance(got["request-2"], LLMError)
    asyncio.run(backend._read(entry))  # the cached Operation is spent: read again, it asks
    assert len(calls) == 3


def test_a_batch_never_recorded_is_found_by_its_display_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listing = fixture("list")
    backend = _backend()
    calls = answering(backend, monkeypatch, listing, listing, {"operations": []})
    found = asyncio.run(backend._find({"key": "0f3c9a"}, claimed=set()))
    assert found is not None and found.batch_id == "batches/123456"
    assert calls == [("GET", "/batches", {"params": {"pageSize": "100"}})]
    assert asyncio.run(backend._find({"key": "absent"}, claimed=set())) is None
    token = listing["nextPageToken"]  # the next page is asked for, then the search ends
    assert [c[2]["params"] for c in calls[1:]] == [
        {"pageSize": "100"},
        {"pageSize": "100", "pageToken": token},
    ]


def test_the_backend_is_discovered_and_batched() -> None:
    plugin = get_backend("gemini_batch")
    assert plugin.batched and plugin.cache is not None
    assert not plugin.cache.marked and not plugin.cache.explicit_cache
