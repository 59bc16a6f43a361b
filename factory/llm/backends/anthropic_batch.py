"""Backend ``anthropic_batch``: Anthropic's Message Batches (half price, within 24 hours).

The lifecycle (journal first, split, re-attach, poll, resubmission, batch prices) is the
one every batch API shares (``factory.llm.backends.batching``); this module is
Anthropic's wire of it, as its docs and SDK describe it (Message Batches API:
https://docs.claude.com/en/docs/build-with-claude/batch-processing and the API reference
https://docs.claude.com/en/api/creating-message-batches, ``retrieving-message-batches``,
``retrieving-message-batch-results``, ``listing-message-batches``; anthropic-sdk-python
``resources/messages/batches.py`` and ``types/messages/message_batch*.py``):

- **Create**: ``POST {base}/messages/batches`` with ``{"requests": [{custom_id, params}]}``,
  ``params`` the body of ``POST /v1/messages`` (``anthropic.messages_body``: the static
  prefix marked for caching, so batches and caching stack). At most 100,000 requests or
  256 MB per batch (``backend_options: max_requests_per_batch``, ``max_batch_mb``; split
  beyond). A ``custom_id`` must match ``^[a-zA-Z0-9_-]{1,64}$``: a request id that does
  not is mapped to one deterministically (:func:`custom_id`), and the journal keeps the
  mapping.
- **Poll**: ``GET {base}/messages/batches/{id}``: ``processing_status`` ``in_progress`` /
  ``canceling`` / ``ended``, ``request_counts`` (``processing``, ``succeeded``,
  ``errored``, ``canceled``, ``expired``), ``expires_at``, ``results_url`` once ended.
- **Results**: JSONL from ``results_url``, one ``{custom_id, result}`` per request,
  ``result.type`` ``succeeded`` (``message``: mapped by ``anthropic.completion_from_anthropic``),
  ``errored`` (``error``: an error response ``{type: error, error: {type, message}}``;
  its type says whether it is worth another submission), ``canceled`` or ``expired``
  (not run: submitted again within ``llm.retry.max_attempts``).
- **A batch never recorded**: Anthropic keeps no metadata on a batch, so one whose
  creation a crashed driver never confirmed is looked for among the account's batches
  by size and creation time (:func:`unclaimed_match`); its results are checked against
  the entry's custom ids when it ends (a stranger's results are ignored and the
  requests submitted again).

Headers: ``x-api-key`` and the pinned ``anthropic-version`` (``anthropic.ANTHROPIC_VERSION``,
option ``api_version``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from factory.core.trajectory import IdentityMemo
from factory.errors import LLMError, LLMServerError
from factory.llm.backends.anthropic import (
    ANTHROPIC_CACHE,
    ANTHROPIC_VERSION,
    DEFAULT_ENDPOINT,
    anthropic_params,
    completion_from_anthropic,
    messages_body,
)
from factory.llm.backends.base import Backend, BackendPlugin, BackendSetup, BatchJournal, LLMRequest
from factory.llm.backends.batching import (
    BatchingOptions,
    BatchLifecycle,
    BatchState,
    batch_endpoint,
)
from factory.llm.errormap import status_error
from factory.llm.pricing import Price
from factory.llm.types import Completion
from factory.secrets import redact

__all__ = [
    "MAX_BATCH_MB",
    "MAX_REQUESTS_PER_BATCH",
    "AnthropicBatchBackend",
    "AnthropicBatchOptions",
    "batch_state",
    "custom_id",
    "parse_result_line",
    "plugin",
    "unclaimed_match",
]

MAX_REQUESTS_PER_BATCH = 100_000
MAX_BATCH_MB = 256.0
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ENVELOPE = len(b'{"requests":[]}')
# An errored result's error type as the HTTP status the online API answers it with
# (https://docs.claude.com/en/api/errors): what decides whether it is retried.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_FIND_WINDOW_S = 900.0  # a create call's answer takes at most its timeout (600 s) + skew


class AnthropicBatchOptions(BatchingOptions):
    """``llm.backend_options`` of ``anthropic_batch``."""

    max_requests_per_batch: int = Field(
        MAX_REQUESTS_PER_BATCH, ge=1, le=MAX_REQUESTS_PER_BATCH, description="Requests per batch."
    )
    max_batch_mb: float = Field(
        MAX_BATCH_MB, gt=0, le=MAX_BATCH_MB, description="Size of one batch, in MB (10^6 bytes)."
    )
    api_version: Literal["2023-06-01", "2026-10-21"] = Field(
        ANTHROPIC_VERSION, description="The anthropic-version header; what is sent follows it."
    )
    thinking_budget: int | None = Field(
        None, ge=1024, description="Extended thinking's budget_tokens (as for anthropic)."
    )


def custom_id(request_id: str) -> str:
    """The ``custom_id`` a request travels under: its own id when Anthropic takes it
    (``^[a-zA-Z0-9_-]{1,64}$``; the factory's request ids always are), else its
    characters made valid and cut, with a digest of the whole id (deterministic: a
    restarted run maps it the same way; the journal keeps the mapping anyway)."""
    if _CUSTOM_ID.match(request_id):
        return request_id
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:16]
    return f"{re.sub(r'[^a-zA-Z0-9_-]', '_', request_id)[:47]}-{digest}"


def _counts(raw: Mapping[str, Any] | None) -> dict[str, int]:
    raw = raw or {}
    n = {k: int(raw.get(k) or 0) for k in ("processing", "succeeded", "errored", "canceled",
                                           "expired")}  # fmt: skip
    return {"total": sum(n.values()), "completed": n["succeeded"],
            "failed": n["errored"] + n["canceled"] + n["expired"]}  # fmt: skip


def batch_state(batch: Mapping[str, Any]) -> BatchState:
    """A ``MessageBatch`` in the lifecycle's words (pure). An ended batch is ``expired``
    when requests expired, ``cancelled`` when it was cancelled, else ``completed``."""
    raw = batch.get("request_counts") or {}
    status = str(batch.get("processing_status"))
    error = None
    if status == "ended":
        if int(raw.get("expired") or 0):
            neutral, error = "expired", "the batch expired (24 hours) before every request ran"
        elif batch.get("cancel_initiated_at") or int(raw.get("canceled") or 0):
            neutral, error = "cancelled", "the batch was cancelled before every request ran"
        else:
            neutral = "completed"
    else:
        neutral = "cancelling" if status == "canceling" else "in_progress"
    fields = {
        "provider_status": status,
        "results_url": batch.get("results_url"),
        "expires_at": batch.get("expires_at"),
        "created_at": batch.get("created_at"),
    }
    return BatchState(str(batch["id"]), neutral, _counts(raw), fields, error)


def parse_result_line(
    line: Mapping[str, Any], endpoint: str, model: str
) -> tuple[str, Completion | LLMError]:
    """One line of a batch's results as (custom id, completion or error) (pure)."""
    cid = str(line.get("custom_id"))
    result = line.get("result") or {}
    kind = result.get("type")
    if kind == "succeeded":
        try:
            return cid, completion_from_anthropic(result.get("message") or {}, endpoint, model)
        except LLMServerError:
            return cid, LLMServerError(f"{endpoint}: batch result has no message")
    if kind == "errored":
        error = (result.get("error") or {}).get("error") or {}
        etype = str(error.get("type") or "api_error")
        detail = f"{etype}: {redact(str(error.get('message') or 'no message'))[:300]}"
        return cid, status_error(endpoint, _ERROR_STATUS.get(etype, 500), detail)
    why = {"canceled": "the batch was cancelled before it ran",
           "expired": "the batch expired (24 hours) before it ran"}.get(str(kind))  # fmt: skip
    return cid, LLMServerError(
        f"{endpoint}: batch request not run ({kind}): {why or 'unknown result type'}"
    )


def _time(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def unclaimed_match(
    batches: Sequence[Mapping[str, Any]], size: int, submitted_at: float, claimed: set[str]
) -> Mapping[str, Any] | None:
    """The batch a crashed run created for a journal entry of ``size`` requests written at
    ``submitted_at`` (pure): among the batches the journal does not claim, of that size,
    created within the window after it, the one created closest to it; None if none."""
    best: tuple[float, Mapping[str, Any]] | None = None
    for batch in batches:
        if str(batch.get("id")) in claimed:
            continue
        if _counts(batch.get("request_counts"))["total"] != size:
            continue
        created = _time(batch.get("created_at"))
        if created is None or not -60.0 <= created - submitted_at <= _FIND_WINDOW_S:
            continue
        gap = abs(created - submitted_at)
        if best is None or gap < best[0]:
            best = (gap, batch)
    return best[1] if best else None


class AnthropicBatchBackend(BatchLifecycle):
    """Requests through ``{base}/messages/batches`` (see the module docstring)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        sampling: Mapping[str, Any],
        price: Price | None,
        options: AnthropicBatchOptions,
        max_submissions: int,
        journal: BatchJournal | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ):
        super().__init__(
            base_url=base_url, api_key=api_key, model=model, sampling=sampling, price=price,
            options=options, max_submissions=max_submissions, journal=journal, sleep=sleep,
        )  # fmt: skip
        self.options: AnthropicBatchOptions = options
        self._params: IdentityMemo[Mapping[str, Any], dict[str, Any]] = IdentityMemo(
            lambda s: anthropic_params(
                model, s, api_version=options.api_version, thinking_budget=options.thinking_budget
            )
        )

    def _headers(self) -> dict[str, str]:
        return {"x-api-key": self._api_key, "anthropic-version": self.options.api_version}

    def _limits(self) -> tuple[int, int]:
        return self.options.max_requests_per_batch, int(self.options.max_batch_mb * 1e6) - _ENVELOPE

    def _custom_id(self, request_id: str) -> str:
        return custom_id(request_id)

    def _line(self, request: LLMRequest, custom_id: str) -> bytes:
        sampling = self._sampling if request.sampling is None else request.sampling
        params = messages_body(request, self.model, self._params(sampling))
        line = {"custom_id": custom_id, "params": params}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()

    async def _create(self, entry: dict[str, Any], lines: list[bytes] | None) -> BatchState | None:
        if lines is None:  # Anthropic keeps no input of its own to create it from
            return None
        data = b'{"requests":[' + b",".join(lines) + b"]}"
        batch = await self._call("POST", "/messages/batches", data=data,
                                 headers={"content-type": "application/json"})  # fmt: skip
        return batch_state(batch)

    async def _find(self, entry: dict[str, Any], claimed: set[str]) -> BatchState | None:
        listing = await self._call("GET", "/messages/batches", params={"limit": "100"})
        found = unclaimed_match(
            listing.get("data") or [], len(entry["request_ids"]), entry["submitted_at"], claimed
        )
        return batch_state(found) if found is not None else None

    async def _poll(self, entry: dict[str, Any]) -> BatchState:
        return batch_state(await self._call("GET", f"/messages/batches/{entry['batch_id']}"))

    async def _read(self, entry: dict[str, Any]) -> dict[str, Completion | LLMError]:
        url = entry.get("results_url") or f"/messages/batches/{entry['batch_id']}/results"
        data = await self._call("GET", url, raw=True)
        results: dict[str, Completion | LLMError] = {}
        for raw in data.splitlines():
            if raw.strip():
                cid, got = parse_result_line(json.loads(raw), self.endpoint, self.model)
                results[cid] = got
        return results


def build(setup: BackendSetup) -> Backend:
    """A Message Batches backend for ``setup.model`` (one endpoint: see
    ``batching.batch_endpoint``).

    Raises:
        ConfigError: more than one endpoint, a missing key, or a sampling option the
            pinned version does not take (naming its key).
    """
    options = setup.options
    assert isinstance(options, AnthropicBatchOptions)
    anthropic_params(  # a bad sampling option fails the build, by key, before anything is paid
        setup.model, setup.llm.sampling, api_version=options.api_version,
        thinking_budget=options.thinking_budget,
    )  # fmt: skip
    base_url, api_key = batch_endpoint(setup, DEFAULT_ENDPOINT)
    return AnthropicBatchBackend(
        base_url=base_url,
        api_key=api_key,
        model=setup.model,
        sampling=setup.llm.sampling,
        price=setup.price,
        options=options,
        max_submissions=setup.llm.retry.max_attempts,
        journal=setup.batch_journal,
        sleep=setup.sleep,
    )


plugin = BackendPlugin(
    "anthropic_batch", AnthropicBatchOptions, build, batched=True, cache=ANTHROPIC_CACHE
)
