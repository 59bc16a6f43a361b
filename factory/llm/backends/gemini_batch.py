"""Backend ``gemini_batch``: Gemini's Batch API (half price, 24-hour target).

The lifecycle (journal first, split, re-attach, poll, resubmission, batch prices) is the
one every batch API shares (``factory.llm.backends.batching``); this module is Google's
wire of it, as the reference and the SDK describe it (Batch API reference,
https://ai.google.dev/api/batch-api, the guide https://ai.google.dev/gemini-api/docs/batch-mode;
googleapis/python-genai ``batches.py``: ``_BatchJobSource_to_mldev``,
``_BatchJob_from_mldev``, ``_InlinedResponse_from_mldev``, ``_ListBatchJobsResponse_from_mldev``
and ``_transformers.t_job_state``):

- **Create**: ``POST {base}/models/{model}:batchGenerateContent`` with ``{batch:
  {displayName, inputConfig: {requests: {requests: [{request, metadata: {key}}]}}}}``:
  each ``request`` the body of ``generateContent`` (``gemini.generate_body``), its
  ``metadata.key`` the request id. **Inline requests only**: Google takes them up to
  20 MB per batch (beyond, a JSONL file uploaded through the Files API); this backend
  splits a larger set into several inline batches under 20 MB instead
  (``backend_options: max_batch_mb``, ``max_requests_per_batch``), which keeps one code
  path and loses nothing but the number of batches. ``displayName`` is
  ``factory-<journal key>``: how a batch a crashed driver created but never recorded is
  found again (``GET {base}/batches``, ``operations[].metadata.displayName``).
- **Poll**: ``GET {base}/batches/{id}``: an Operation whose ``metadata`` is the batch:
  ``state`` (``BATCH_STATE_PENDING`` / ``RUNNING`` / ``SUCCEEDED`` / ``FAILED`` /
  ``CANCELLED`` / ``EXPIRED``; the SDK reads them as ``JOB_STATE_*``, both are taken),
  ``batchStats`` (``requestCount``, ``successfulRequestCount``, ``failedRequestCount``,
  ``pendingRequestCount``; int64 as JSON strings), ``output`` once done.
- **Results**: ``metadata.output.inlinedResponses.inlinedResponses[]`` (else the
  Operation's ``response``), each ``{response | error, metadata: {key}}`` in request
  order: a ``GenerateContentResponse`` mapped by ``gemini.completion_from_gemini``, or a
  ``google.rpc.Status`` error (its code says whether another submission may help). A
  request without a line (an expired or cancelled batch) was not answered: submitted
  again within ``llm.retry.max_attempts``.

The API version is pinned to ``v1beta`` (the Batch API is documented there only), the
URL's version segment replaced (``gemini.endpoint_url``); the key goes in the
``x-goog-api-key`` header, never in the URL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import Field

from factory.core.trajectory import IdentityMemo
from factory.errors import LLMError, LLMServerError
from factory.llm.backends.base import Backend, BackendPlugin, BackendSetup, BatchJournal, LLMRequest
from factory.llm.backends.batching import (
    BatchingOptions,
    BatchLifecycle,
    BatchState,
    batch_endpoint,
)
from factory.llm.backends.gemini import (
    GEMINI_CACHE,
    completion_from_gemini,
    default_endpoint,
    endpoint_url,
    gemini_error,
    gemini_params,
    generate_body,
)
from factory.llm.pricing import Price
from factory.llm.types import Completion

__all__ = [
    "API_VERSION",
    "MAX_INLINE_MB",
    "GeminiBatchBackend",
    "GeminiBatchOptions",
    "batch_state",
    "parse_inlined_responses",
    "plugin",
]

log = logging.getLogger(__name__)

API_VERSION = "v1beta"
MAX_INLINE_MB = 20.0
_ENVELOPE = 1024  # {"batch": {"displayName": ..., "inputConfig": {"requests": {...}}}}
_STATES = {
    "PENDING": "validating",
    "RUNNING": "in_progress",
    "SUCCEEDED": "completed",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "EXPIRED": "expired",
}
# google.rpc.Code of a per-request error as the HTTP status Google maps it to
# (https://cloud.google.com/apis/design/errors#handling_errors): what decides a retry.
_GRPC_HTTP = {1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400,
              10: 409, 11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401}  # fmt: skip
_LIST_PAGES = 10  # pages of 100 batches looked through for a batch never recorded


class GeminiBatchOptions(BatchingOptions):
    """``llm.backend_options`` of ``gemini_batch``."""

    max_requests_per_batch: int = Field(
        10_000, ge=1, description="Requests per batch (the factory's bound, not Google's)."
    )
    max_batch_mb: float = Field(
        MAX_INLINE_MB, gt=0, le=MAX_INLINE_MB,
        description="Size of one inline batch, in MB (10^6 bytes; Google takes 20 MB inline).",
    )  # fmt: skip
    include_thoughts: bool = Field(
        True, description="Ask for thought summaries when thinking is configured."
    )
    thinking_budget: int | None = Field(
        None, ge=-1, description="thinkingBudget (-1 dynamic, 0 off); overrides reasoning_effort."
    )


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def batch_state(operation: Mapping[str, Any]) -> BatchState:
    """A batch's Operation in the lifecycle's words (pure)."""
    meta = operation.get("metadata") or {}
    raw = str(meta.get("state") or "")
    status = _STATES.get(raw.removeprefix("BATCH_STATE_").removeprefix("JOB_STATE_"))
    if status is None:  # unspecified: done or not is all the Operation says
        status = "completed" if operation.get("done") else "in_progress"
    stats = meta.get("batchStats") or {}
    counts = {
        "total": _count(stats.get("requestCount")),
        "completed": _count(stats.get("successfulRequestCount")),
        "failed": _count(stats.get("failedRequestCount")),
    }
    error = operation.get("error") or {}
    why = str(error.get("message") or "") or None
    fields = {"provider_status": raw, "display_name": meta.get("displayName")}
    return BatchState(str(operation["name"]), status, counts, fields, why)


def parse_inlined_responses(
    operation: Mapping[str, Any], keys: list[str], endpoint: str, model: str
) -> dict[str, Completion | LLMError]:
    """An ended batch's inline results by key (pure): ``metadata.key`` names each line
    (its position in ``keys``, the request order, where it names none)."""
    output = (operation.get("metadata") or {}).get("output") or operation.get("response") or {}
    lines = (output.get("inlinedResponses") or {}).get("inlinedResponses") or []
    results: dict[str, Completion | LLMError] = {}
    for i, line in enumerate(lines):
        key = (line.get("metadata") or {}).get("key")
        if key is None and i < len(keys):
            key = keys[i]
        if key is None:
            continue
        if line.get("response") is not None:
            try:
                results[str(key)] = completion_from_gemini(line["response"], endpoint, model)
            except LLMServerError:
                results[str(key)] = LLMServerError(f"{endpoint}: batch response has no candidate")
            continue
        error = line.get("error") or {}
        code = _count(error.get("code")) or 13
        status = code if code >= 100 else _GRPC_HTTP.get(code, 500)
        results[str(key)] = gemini_error(endpoint, status, {"error": error})
    if output.get("responsesFile"):
        log.warning("batch %s wrote its results to a file (%s): only inline results are read",
                    operation.get("name"), output["responsesFile"])  # fmt: skip
    return results


class GeminiBatchBackend(BatchLifecycle):
    """Requests through ``models/{model}:batchGenerateContent`` (see the module docstring)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        sampling: Mapping[str, Any],
        price: Price | None,
        options: GeminiBatchOptions,
        max_submissions: int,
        journal: BatchJournal | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ):
        super().__init__(
            base_url=endpoint_url(base_url, API_VERSION), api_key=api_key, model=model,
            sampling=sampling, price=price, options=options, max_submissions=max_submissions,
            journal=journal, sleep=sleep,
        )  # fmt: skip
        self.options: GeminiBatchOptions = options
        self._params: IdentityMemo[Mapping[str, Any], dict[str, Any]] = IdentityMemo(
            lambda s: gemini_params(
                model,
                s,
                include_thoughts=options.include_thoughts,
                thinking_budget=options.thinking_budget,
            )
        )
        self._ended: dict[str, Mapping[str, Any]] = {}  # batch name -> its last Operation

    def _headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self._api_key}

    def _limits(self) -> tuple[int, int]:
        return self.options.max_requests_per_batch, int(self.options.max_batch_mb * 1e6) - _ENVELOPE

    def _line(self, request: LLMRequest, custom_id: str) -> bytes:
        sampling = self._sampling if request.sampling is None else request.sampling
        body = generate_body(request, self.model, self._params(sampling))
        line = {"request": body, "metadata": {"key": custom_id}}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()

    def _state(self, operation: Mapping[str, Any]) -> BatchState:
        state = batch_state(operation)
        if operation.get("done"):
            self._ended[state.batch_id] = operation  # its results: no second download
        return state

    async def _create(self, entry: dict[str, Any], lines: list[bytes] | None) -> BatchState | None:
        if lines is None:  # the batch's requests live only in the create call
            return None
        head = json.dumps({"displayName": f"factory-{entry['key']}"})[:-1]
        data = (f'{{"batch":{head},"inputConfig":{{"requests":{{"requests":['.encode()
                + b",".join(lines) + b"]}}}}")  # fmt: skip
        model = self.model.removeprefix("models/")
        operation = await self._call("POST", f"/models/{model}:batchGenerateContent", data=data,
                                     headers={"content-type": "application/json"})  # fmt: skip
        return self._state(operation)

    async def _find(self, entry: dict[str, Any], claimed: set[str]) -> BatchState | None:
        want = f"factory-{entry['key']}"
        token: str | None = None
        for _ in range(_LIST_PAGES):
            params = {"pageSize": "100", **({"pageToken": token} if token else {})}
            listing = await self._call("GET", "/batches", params=params)
            for operation in listing.get("operations") or []:
                if (operation.get("metadata") or {}).get("displayName") == want:
                    return self._state(operation)
            token = listing.get("nextPageToken")
            if not token:
                break
        return None

    async def _poll(self, entry: dict[str, Any]) -> BatchState:
        return self._state(await self._call("GET", f"/{entry['batch_id']}"))

    async def _read(self, entry: dict[str, Any]) -> dict[str, Completion | LLMError]:
        operation = self._ended.pop(entry["batch_id"], None)
        if operation is None:
            operation = await self._call("GET", f"/{entry['batch_id']}")
        keys = list(entry.get("custom_ids") or entry["request_ids"])
        return parse_inlined_responses(operation, keys, self.endpoint, self.model)


def build(setup: BackendSetup) -> Backend:
    """A Batch API backend for ``setup.model`` (one endpoint: ``batching.batch_endpoint``).

    Raises:
        ConfigError: more than one endpoint, a missing key, a query string in the URL, or
            a bad sampling option (naming its key).
    """
    options = setup.options
    assert isinstance(options, GeminiBatchOptions)
    gemini_params(  # a bad sampling option fails the build, by key, before anything is paid
        setup.model, setup.llm.sampling, include_thoughts=options.include_thoughts,
        thinking_budget=options.thinking_budget,
    )  # fmt: skip
    base_url, api_key = batch_endpoint(setup, default_endpoint())
    return GeminiBatchBackend(
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


# Implicit caching only: an explicit context cache is the online backend's (a batch names
# no cache here), so the plan's estimate reads the implicit terms.
plugin = BackendPlugin(
    "gemini_batch",
    GeminiBatchOptions,
    build,
    batched=True,
    cache=dataclasses.replace(GEMINI_CACHE, explicit_cache=False),
)
