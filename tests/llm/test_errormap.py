"""One error map for every backend: the same HTTP status means the same factory error,
whether the openai SDK or the aiohttp transport saw it."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest

from factory.errors import LLMBadRequest, LLMError, LLMRateLimited, LLMServerError, LLMTimeout
from factory.llm.errormap import HTTPStatusFailure, UnusableResponse, translate_error

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz0123456789"


def sdk_error(status: int, message: str, headers: dict[str, str] | None = None) -> Exception:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request)
    body = {"message": message}
    cls = {429: openai.RateLimitError, 400: openai.BadRequestError}.get(status)
    if cls is None:
        cls = openai.InternalServerError if status >= 500 else openai.APIStatusError
    return cls(message, response=response, body=body)


def raw_error(status: int, message: str, headers: dict[str, str] | None = None) -> Exception:
    body = json.dumps({"error": {"message": message}}).encode()
    return HTTPStatusFailure(status, body, headers or {})


@pytest.mark.parametrize("make", [sdk_error, raw_error], ids=["openai", "aiohttp"])
@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, LLMBadRequest),
        (401, LLMBadRequest),
        (404, LLMBadRequest),
        (408, LLMServerError),
        (409, LLMServerError),
        (429, LLMRateLimited),
        (500, LLMServerError),
        (503, LLMServerError),
    ],
)
def test_both_transports_map_a_status_to_the_same_error(make, status, expected) -> None:
    err = translate_error(make(status, f"no, key {KEY}", {"Retry-After": "3"}), "ep")
    assert type(err) is expected and err.status == status and err.endpoint == "ep"
    assert KEY not in str(err) and "no, key" in str(err)
    if status == 429:
        assert isinstance(err, LLMRateLimited) and err.retry_after == 3.0


def test_the_same_message_for_the_same_status() -> None:
    a = translate_error(sdk_error(503, "busy"), "ep")
    b = translate_error(raw_error(503, "busy"), "ep")
    assert str(a) == str(b) == "ep: HTTP 503: busy"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TimeoutError(), LLMTimeout),
        (openai.APITimeoutError(httpx.Request("POST", "http://x")), LLMTimeout),
        (openai.APIConnectionError(request=httpx.Request("POST", "http://x")), LLMServerError),
        (UnusableResponse("<html>" + "x" * 5000), LLMServerError),
    ],
)
def test_transport_failures(exc: Exception, expected: type[LLMError]) -> None:
    err = translate_error(exc, "ep")
    assert type(err) is expected and len(str(err)) < 400


def test_aiohttp_connection_errors_and_bugs() -> None:
    import aiohttp

    assert type(translate_error(aiohttp.ClientConnectionError("refused"), "ep")) is LLMServerError
    assert translate_error(KeyError("a bug"), "ep") is None  # propagates unchanged
