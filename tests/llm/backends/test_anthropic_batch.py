"""The ``anthropic_batch`` wire, pure: request lines, custom ids, limits, batch states and
result lines of every type.

The shapes below are Anthropic's documented ones (API reference, "Create a Message
Batch", "Retrieve a Message Batch", "Retrieve Message Batch results":
https://docs.claude.com/en/api/creating-message-batches and the pages beside it;
anthropic-sdk-python ``types/messages/message_batch.py``,
``message_batch_individual_response.py``, ``message_batch_*_result.py``).
"""

from __future__ import annotations

import json
import re

import pytest

from factory.errors import LLMBadRequest, LLMError, LLMRateLimited, LLMServerError
from factory.llm.backends import get_backend
from factory.llm.backends.anthropic import ANTHROPIC_VERSION
from factory.llm.backends.anthropic_batch import (
    AnthropicBatchBackend,
    AnthropicBatchOptions,
    batch_state,
    custom_id,
    parse_result_line,
    unclaimed_match,
)
from factory.llm.backends.batching import split_requests
from factory.llm.types import Completion
from tests.llm.backends.batchkit import requests

ENDPOINT = "api.anthropic.com"

# A MessageBatch while it runs and once it ended (the reference's example objects).
IN_PROGRESS = {
    "id": "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF",
    "type": "message_batch",
    "processing_status": "in_progress",
    "request_counts": {
        "processing": 100,
        "succeeded": 50,
        "errored": 30,
        "canceled": 10,
        "expired": 10,
    },
    "ended_at": None,
    "created_at": "2024-08-20T18:37:24.100435Z",
    "expires_at": "2024-08-21T18:37:24.100435Z",
    "archived_at": None,
    "cancel_initiated_at": None,
    "results_url": None,
}
SUCCEEDED = {
    "custom_id": "my-first-request",
    "result": {
        "type": "succeeded",
        "message": {
            "id": "msg_014VwiXbi91y3JMjcpyGBHX5",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Hello again! It's nice to see you."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 11,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 1200,
                "output_tokens": 36,
            },
        },
    },
}
ERRORED = {
    "custom_id": "my-second-request",
    "result": {
        "type": "errored",
        "error": {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "Validation error..."},
        },
    },
}


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


def test_batch_states_in_neutral_words() -> None:
    live = batch_state(IN_PROGRESS)
    assert (live.batch_id, live.status) == (IN_PROGRESS["id"], "in_progress")
    assert live.counts == {"total": 200, "completed": 50, "failed": 50}
    assert live.fields["provider_status"] == "in_progress"
    assert batch_state({**IN_PROGRESS, "processing_status": "canceling"}).status == "cancelling"
    ended = {**IN_PROGRESS, "processing_status": "ended", "results_url": "https://x/results",
             "request_counts": {"processing": 0, "succeeded": 3, "errored": 1, "canceled": 0,
                                "expired": 0}}  # fmt: skip
    done = batch_state(ended)
    assert done.status == "completed" and done.fields["results_url"] == "https://x/results"
    expired = batch_state({**ended, "request_counts": {"succeeded": 2, "expired": 2}})
    assert expired.status == "expired" and "expired" in str(expired.error)
    cancelled = batch_state({**ended, "cancel_initiated_at": "2024-08-20T19:00:00Z",
                             "request_counts": {"succeeded": 2, "canceled": 2}})  # fmt: skip
    assert cancelled.status == "cancelled" and cancelled.counts == {
        "total": 4, "completed": 2, "failed": 2}  # fmt: skip


def test_result_lines_of_every_type() -> None:
    cid, ok = parse_result_line(SUCCEEDED, ENDPOINT, "claude-sonnet-4-5")
    assert cid == "my-first-request" and isinstance(ok, Completion)
    assert ok.text.startswith("Hello again") and ok.finish_reason == "stop"
    assert ok.usage.input == 1211 and ok.usage.cached_input == 1200 and ok.usage.output == 36

    cid, bad = parse_result_line(ERRORED, ENDPOINT, "claude-sonnet-4-5")
    assert cid == "my-second-request"
    assert isinstance(bad, LLMBadRequest) and not bad.retryable  # fixing it takes a new request
    assert "invalid_request_error" in str(bad) and "Validation error" in str(bad)

    def errored(kind: str) -> LLMError:
        line = {"custom_id": "c", "result": {"type": "errored", "error": {
            "type": "error", "error": {"type": kind, "message": "try later"}}}}  # fmt: skip
        got = parse_result_line(line, ENDPOINT, "m")[1]
        assert isinstance(got, LLMError)
        return got

    assert isinstance(errored("overloaded_error"), LLMServerError)
    assert errored("overloaded_error").retryable and errored("api_error").retryable
    assert isinstance(errored("rate_limit_error"), LLMRateLimited)
    assert not errored("authentication_error").retryable
    for kind in ("canceled", "expired"):
        _, err = parse_result_line({"custom_id": "c", "result": {"type": kind}}, ENDPOINT, "m")
        assert isinstance(err, LLMServerError) and err.retryable  # not run: submitted again
        assert kind in str(err)


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
