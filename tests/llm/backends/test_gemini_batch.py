"""The ``gemini_batch`` wire, pure: request lines, inline limits, batch states and the
inline results of every kind.

The shapes below are Google's documented ones (Batch API reference,
https://ai.google.dev/api/batch-api: ``GenerateContentBatch``, ``BatchState``,
``BatchStats``, ``InlinedResponse``; googleapis/python-genai ``batches.py``
``_BatchJob_from_mldev`` reads ``name`` and ``metadata.{displayName, state, output}`` of
the Operation, ``_transformers.t_job_state`` maps ``BATCH_STATE_*`` to ``JOB_STATE_*``).
"""

from __future__ import annotations

import json

import pytest

from factory.errors import LLMBadRequest, LLMRateLimited, LLMServerError
from factory.llm.backends import get_backend
from factory.llm.backends.batching import split_requests
from factory.llm.backends.gemini_batch import (
    GeminiBatchBackend,
    GeminiBatchOptions,
    batch_state,
    parse_inlined_responses,
)
from factory.llm.types import Completion
from tests.llm.backends.batchkit import requests

ENDPOINT = "generativelanguage.googleapis.com"
RUNNING = {
    "name": "batches/123456",
    "metadata": {
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
        "model": "models/gemini-2.5-flash",
        "displayName": "factory-abc",
        "createTime": "2025-07-08T12:00:00.000000Z",
        "state": "BATCH_STATE_RUNNING",
        "batchStats": {
            "requestCount": "3",
            "successfulRequestCount": "1",
            "pendingRequestCount": "2",
        },
    },
}
RESPONSE = {
    "candidates": [
        {
            "content": {"parts": [{"text": "Hello there."}], "role": "model"},
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 1300,
        "cachedContentTokenCount": 1024,
        "candidatesTokenCount": 4,
        "thoughtsTokenCount": 20,
        "totalTokenCount": 1324,
    },
    "modelVersion": "gemini-2.5-flash",
}


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


@pytest.mark.parametrize(
    ("state", "neutral"),
    [
        ("BATCH_STATE_PENDING", "validating"),
        ("BATCH_STATE_RUNNING", "in_progress"),
        ("BATCH_STATE_SUCCEEDED", "completed"),
        ("BATCH_STATE_FAILED", "failed"),
        ("BATCH_STATE_CANCELLED", "cancelled"),
        ("BATCH_STATE_EXPIRED", "expired"),
        ("JOB_STATE_SUCCEEDED", "completed"),
        ("JOB_STATE_RUNNING", "in_progress"),
    ],
)
def test_batch_states_in_neutral_words(state: str, neutral: str) -> None:
    got = batch_state({**RUNNING, "metadata": {**RUNNING["metadata"], "state": state}})
    assert got.status == neutral and got.batch_id == "batches/123456"
    assert got.counts == {"total": 3, "completed": 1, "failed": 0}  # int64s come as strings
    assert got.fields["display_name"] == "factory-abc"


def test_a_failed_batch_says_why() -> None:
    failed = {
        **RUNNING,
        "done": True,
        "error": {"code": 13, "message": "Internal error."},
        "metadata": {**RUNNING["metadata"], "state": "BATCH_STATE_FAILED"},
    }
    got = batch_state(failed)
    assert got.status == "failed" and got.error == "Internal error."


def test_inline_results_of_every_kind() -> None:
    lines = [
        {"response": RESPONSE, "metadata": {"key": "r-0"}},
        {"error": {"code": 3, "message": "Invalid argument: contents"}, "metadata": {"key": "r-1"}},
        {"error": {"code": 13, "message": "Internal error"}, "metadata": {"key": "r-2"}},
        {"error": {"code": 8, "message": "Resource exhausted"}, "metadata": {"key": "r-3"}},
        {"response": RESPONSE},  # no metadata: its position names it
    ]
    operation = {
        **RUNNING,
        "done": True,
        "metadata": {
            **RUNNING["metadata"],
            "state": "BATCH_STATE_SUCCEEDED",
            "output": {"inlinedResponses": {"inlinedResponses": lines}},
        },
    }
    keys = ["r-0", "r-1", "r-2", "r-3", "r-4", "r-5"]
    got = parse_inlined_responses(operation, keys, ENDPOINT, "gemini-2.5-flash")
    ok = got["r-0"]
    assert isinstance(ok, Completion) and ok.text == "Hello there." and ok.finish_reason == "stop"
    assert ok.usage.input == 1300 and ok.usage.cached_input == 1024 and ok.usage.output == 24
    assert isinstance(got["r-1"], LLMBadRequest) and not got["r-1"].retryable
    assert "Invalid argument" in str(got["r-1"])
    assert isinstance(got["r-2"], LLMServerError) and got["r-2"].retryable
    assert isinstance(got["r-3"], LLMRateLimited)
    assert isinstance(got["r-4"], Completion)
    assert "r-5" not in got  # no line: not answered (the lifecycle submits it again)
    # the Operation's response holds the same output (the REST examples read it there)
    moved = {
        **RUNNING,
        "done": True,
        "response": {"inlinedResponses": {"inlinedResponses": lines[:1]}},
    }
    assert isinstance(parse_inlined_responses(moved, keys, ENDPOINT, "m")["r-0"], Completion)


def test_the_backend_is_discovered_and_batched() -> None:
    plugin = get_backend("gemini_batch")
    assert plugin.batched and plugin.cache is not None
    assert not plugin.cache.marked and not plugin.cache.explicit_cache
