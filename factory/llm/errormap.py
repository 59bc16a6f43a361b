"""The one map from foreign LLM errors onto ``factory.errors`` (issue 9, point 4).

Every backend raises what its transport raises: the openai SDK its exception
classes, the aiohttp transport ``aiohttp.ClientError`` or an
:class:`HTTPStatusFailure` (a status and a body, the SDK-free equivalent of
``openai.APIStatusError``). ``translate_error`` turns any of them into an
``LLMError``, most specific first (as httpx's ``map_httpcore_exceptions``);
the caller chains with ``from``. One table decides what a status means
(``status_error``), so the two backends cannot drift apart: before, the SDK's
exceptions and the aiohttp statuses were mapped by two functions that had to
be kept in step by hand.

Messages name the endpoint, the status and the server's own short reason,
redacted and truncated: never a key, never a payload.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import aiohttp
import openai

from factory.errors import (
    LLMBadRequest,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
    short,
)
from factory.llm.retry import parse_retry_after
from factory.llm.types import RateLimits
from factory.secrets import redact

__all__ = [
    "HTTPStatusFailure",
    "InferenceFailure",
    "UnusableResponse",
    "status_error",
    "translate_error",
]


class HTTPStatusFailure(Exception):
    """A non-2xx answer, as a transport without an SDK reports it (not yet translated);
    ``rate_limits``: the budget its headers stated, read by the transport that knows the
    provider's header names (a 429's: the client's pacer re-bases on it)."""

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: Mapping[str, str],
        rate_limits: RateLimits | None = None,
    ):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
        self.headers = headers
        self.rate_limits = rate_limits


class UnusableResponse(Exception):
    """A 2xx answer whose body cannot be read (not JSON), not yet translated."""


class InferenceFailure(Exception):
    """An in-process engine failed a request (Ray Data LLM's ``__inference_error__``,
    ``"Type: message"``), or its whole execution failed (``retryable``), not yet translated."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


# Exception types of a failed engine row that say the request itself is wrong (a prompt
# longer than the model's context, bad sampling parameters): retrying cannot help.
_REQUEST_FAULTS = ("ValueError", "TypeError", "KeyError", "ValidationError")


def inference_error(endpoint: str, exc: InferenceFailure) -> LLMError:
    """What an engine's failure means: a fault of the request (``ValueError: ...``) is a
    bad request; anything else (the engine, the execution) a server error, retried."""
    text = short(redact(str(exc)), 200)
    kind = text.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    if not exc.retryable and kind in _REQUEST_FAULTS:
        return LLMBadRequest(
            f"{endpoint}: the engine refused the request: {text}; retrying will not help, "
            "check the prompt length against the model's context and the sampling options",
            endpoint=endpoint,
        )
    return LLMServerError(f"{endpoint}: inference failed: {text}", endpoint=endpoint)


def _body_detail(raw: bytes) -> str:
    try:
        detail = json.loads(raw).get("error", {}).get("message") or ""
    except (ValueError, AttributeError):
        detail = raw.decode("utf-8", "replace")
    return short(redact(str(detail)), 200)


def _sdk_detail(exc: openai.APIError) -> str:
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    return short(redact(str(message if isinstance(message, str) else exc.message)), 200)


def status_error(
    endpoint: str,
    status: int,
    detail: str,
    retry_after: float | None = None,
    rate_limits: RateLimits | None = None,
) -> LLMError:
    """What an HTTP error status means: 429 rate limited, 408/409/5xx a server error
    (retryable), any other 4xx a bad request (retrying will not help).

    Args:
        endpoint: endpoint name, for the message and ``.endpoint``.
        status: the HTTP status (400 or more).
        detail: the server's reason, already redacted and truncated.
        retry_after: the server's ``Retry-After`` in seconds, if it sent one.
        rate_limits: the budget a 429 stated, if it stated one.
    """
    if status == 429:
        hint = f"; server asks to wait {retry_after:.1f}s" if retry_after is not None else ""
        return LLMRateLimited(
            f"{endpoint}: HTTP 429 rate limited{hint}: {detail}",
            retry_after=retry_after,
            rate_limits=rate_limits,
            endpoint=endpoint,
            status=429,
        )
    if status in (408, 409) or status >= 500:
        return LLMServerError(
            f"{endpoint}: HTTP {status}: {detail}", endpoint=endpoint, status=status
        )
    return LLMBadRequest(
        f"{endpoint}: HTTP {status}: {detail}; retrying will not help, check the model "
        "name, key and request parameters",
        endpoint=endpoint,
        status=status,
    )


def _connection_failed(endpoint: str, exc: BaseException) -> LLMServerError:
    return LLMServerError(
        f"{endpoint}: connection failed: {short(redact(str(exc)), 200)}", endpoint=endpoint
    )


def translate_error(exc: BaseException, endpoint: str) -> LLMError | None:
    """Map a transport's exception onto the factory hierarchy.

    Most specific first: ``APITimeoutError`` is an ``APIConnectionError``,
    ``RateLimitError`` an ``APIStatusError``, and aiohttp's ``ServerTimeoutError``
    a ``ClientError`` (a connection failure, as the aiohttp backend always said).
    The caller chains with ``from``.

    Args:
        exc: what the transport raised.
        endpoint: endpoint name, for the message and ``.endpoint``.

    Returns:
        The factory error, or ``None`` for exceptions that are not transport
        failures (programming errors propagate unchanged).
    """
    if isinstance(exc, LLMError):
        return exc
    if isinstance(exc, openai.APITimeoutError):
        return _timeout(endpoint)
    if isinstance(exc, aiohttp.ClientError):
        return _connection_failed(endpoint, exc)
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return _timeout(endpoint)
    if isinstance(exc, HTTPStatusFailure):
        return status_error(
            endpoint,
            exc.status,
            _body_detail(exc.body),
            parse_retry_after(exc.headers),
            exc.rate_limits,
        )
    if isinstance(exc, UnusableResponse):
        text = short(redact(str(exc)), 120)
        return LLMServerError(
            f"{endpoint}: unusable response (not JSON): {text}", endpoint=endpoint
        )
    if isinstance(exc, InferenceFailure):
        return inference_error(endpoint, exc)
    if isinstance(exc, openai.APIConnectionError):
        return _connection_failed(endpoint, exc)
    if isinstance(exc, openai.APIStatusError):
        retry_after = parse_retry_after(exc.response.headers) if exc.status_code == 429 else None
        return status_error(endpoint, exc.status_code, _sdk_detail(exc), retry_after)
    if isinstance(exc, openai.APIError):  # e.g. a response that does not match the schema
        return LLMServerError(
            f"{endpoint}: unusable response: {_sdk_detail(exc)}", endpoint=endpoint
        )
    return None


def _timeout(endpoint: str) -> LLMTimeout:
    return LLMTimeout(
        f"{endpoint}: request timed out; raise llm.timeout_s if the model needs longer",
        endpoint=endpoint,
    )
