"""Backend ``openai_batch``: OpenAI's Batch API (half price, answers within 24 hours).

Why a backend of its own: an offline data job does not need its answers in
seconds, and the Batch API does the same work at half the online price. The
engine hands a batched backend every request its actor has waiting at once
(``factory.llm.batcher``); this module writes them as JSONL input files within
the API's limits (50,000 requests and 200 MB per file; split beyond), uploads
each (``POST /v1/files``, purpose ``batch``), creates a batch (``POST
/v1/batches``, window ``24h``), polls it with backoff (``GET
/v1/batches/{id}``), downloads its output and error files (``GET
/v1/files/{id}/content``) and maps every line back by ``custom_id`` (the request
id). The stage stores each result in the response cache as it is yielded.

Resumable: every batch is written to the run's batch journal
(``factory.io.runstate.BatchJournal``, ``OUT/batches/``) *before* it is created
(with its input file and request ids) and again once created and whenever its
status changes. A request the journal places in a batch is never submitted
again while that batch lives: a restarted driver's actors re-attach to it
(a batch whose creation was not confirmed is found by its input file, or
created then). A batch that ended expired, cancelled or failed keeps its
partial results; its other requests are submitted again while their
submissions stay within ``llm.retry.max_attempts``, else they fail with the
reason. A per-request error line is treated the same way (5xx and 429 again,
another 4xx fails at once).

Money: the engine builds this backend with the model's Batch-tier price
(``PriceTable.lookup_batch``), so cost and budget count batch prices.

The lifecycle (journal, split, attach, poll, resubmission, pricing) is the one every
provider's batch API shares (``factory.llm.backends.batching``); this module is OpenAI's
wire of it: the input file, ``/v1/batches`` and the output and error files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from pydantic import Field

from factory.errors import LLMError, LLMServerError
from factory.llm.backends.base import (
    OPENAI_CACHE,
    Backend,
    BackendPlugin,
    BackendSetup,
    BatchJournal,
    LLMRequest,
)
from factory.llm.backends.batching import (
    BatchingOptions,
    BatchLifecycle,
    BatchState,
    MemoryJournal,
    batch_endpoint,
    split_requests,
)
from factory.llm.backends.openai_wire import chat_messages, completion_from_openai
from factory.llm.errormap import status_error
from factory.llm.params import build_request
from factory.llm.pricing import Price, cost
from factory.llm.types import Completion
from factory.secrets import redact

__all__ = [
    "LIVE",
    "MAX_FILE_MB",
    "MAX_REQUESTS_PER_FILE",
    "BatchBackend",
    "BatchOptions",
    "MemoryJournal",
    "parse_output_line",
    "plugin",
    "split_requests",
]

MAX_REQUESTS_PER_FILE = 50_000
MAX_FILE_MB = 200.0
LIVE = ("validating", "in_progress", "finalizing", "cancelling")  # OpenAI's live statuses


class BatchOptions(BatchingOptions):
    """``llm.backend_options`` of ``openai_batch``."""

    max_requests_per_file: int = Field(
        MAX_REQUESTS_PER_FILE, ge=1, le=MAX_REQUESTS_PER_FILE, description="Requests per batch."
    )
    max_file_mb: float = Field(
        MAX_FILE_MB, gt=0, le=MAX_FILE_MB, description="Size of one input file, in MB."
    )


def parse_output_line(
    line: Mapping[str, Any], endpoint: str, price: Price | None, model: str
) -> Completion | LLMError:
    """One line of a batch's output or error file as a completion or an error (pure)."""
    error = line.get("error")
    response = line.get("response")
    if response is None or error:
        code = (error or {}).get("code") or "batch_error"
        message = redact(str((error or {}).get("message") or "no response"))[:300]
        return LLMServerError(f"{endpoint}: batch request not run ({code}): {message}")
    status = int(response.get("status_code") or 0)
    body = response.get("body") or {}
    if status != 200:
        detail = redact(str((body.get("error") or {}).get("message") or body))[:300]
        return status_error(endpoint, status, detail)
    try:
        c = completion_from_openai(body, endpoint, model)
    except LLMServerError:
        return LLMServerError(f"{endpoint}: batch response has no message")
    return dataclasses.replace(c, cost_usd=cost(c.usage, price), attempts=1)


def batch_state(batch: Mapping[str, Any]) -> BatchState:
    """An OpenAI batch object in the lifecycle's words (its statuses are the neutral ones)."""
    errors = ((batch.get("errors") or {}).get("data") or [{}])[0]
    return BatchState(
        batch_id=str(batch["id"]),
        status=str(batch.get("status")),
        counts=batch.get("request_counts"),
        fields={
            "output_file_id": batch.get("output_file_id"),
            "error_file_id": batch.get("error_file_id"),
            "errors": batch.get("errors"),
        },
        error=errors.get("message") or None,
    )


class BatchBackend(BatchLifecycle):
    """Requests through ``/v1/files`` and ``/v1/batches`` of one OpenAI-compatible server."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        sampling: Mapping[str, Any],
        price: Price | None,
        options: BatchOptions,
        max_submissions: int,
        journal: BatchJournal | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ):
        super().__init__(
            base_url=base_url, api_key=api_key, model=model, sampling=sampling, price=price,
            options=options, max_submissions=max_submissions, journal=journal, sleep=sleep,
        )  # fmt: skip
        self.options: BatchOptions = options

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"}

    def _limits(self) -> tuple[int, int]:
        return self.options.max_requests_per_file, int(self.options.max_file_mb * 1024**2)

    def _line(self, request: LLMRequest, custom_id: str) -> bytes:
        sampling = self._sampling if request.sampling is None else dict(request.sampling)
        body = build_request(self.model, chat_messages(request.messages), sampling)
        line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                "body": body}  # fmt: skip
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()

    async def _prepare(self, entry: dict[str, Any], lines: list[bytes]) -> None:
        """Upload the input file: its id is how a batch never recorded is found again."""
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", b"\n".join(lines) + b"\n", filename="requests.jsonl",
                       content_type="application/jsonl")  # fmt: skip
        entry["input_file_id"] = (await self._call("POST", "/files", data=form))["id"]

    async def _create(self, entry: dict[str, Any], lines: list[bytes] | None) -> BatchState:
        """Create the batch from the uploaded input file (so ``lines`` is not needed)."""
        batch = await self._call(
            "POST",
            "/batches",
            json={
                "input_file_id": entry["input_file_id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": {"factory_key": entry["key"]},
            },
        )
        return batch_state(batch)

    async def _find(self, entry: dict[str, Any], claimed: set[str]) -> BatchState | None:
        listing = await self._call("GET", "/batches", params={"limit": "100"})
        for batch in listing.get("data") or []:
            if batch.get("input_file_id") == entry["input_file_id"]:
                return batch_state(batch)
        return None

    async def _poll(self, entry: dict[str, Any]) -> BatchState:
        return batch_state(await self._call("GET", f"/batches/{entry['batch_id']}"))

    async def _read(self, entry: dict[str, Any]) -> dict[str, Completion | LLMError]:
        results: dict[str, Completion | LLMError] = {}
        for key in ("output_file_id", "error_file_id"):
            if entry.get(key):
                data = await self._call("GET", f"/files/{entry[key]}/content", raw=True)
                for raw in data.splitlines():
                    if raw.strip():
                        line = json.loads(raw)
                        results[str(line.get("custom_id"))] = parse_output_line(
                            line, self.endpoint, self._price, self.model
                        )
        return results


def build(setup: BackendSetup) -> Backend:
    """A Batch API backend for ``setup.model`` on the recipe's one endpoint.

    Raises:
        ConfigError: more than one endpoint (``batching.batch_endpoint``), a missing key,
            or a bad sampling option (by key).
    """
    build_request(setup.model, [], setup.llm.sampling)  # bad sampling options fail here, by key
    base_url, api_key = batch_endpoint(setup)
    options = setup.options
    assert isinstance(options, BatchOptions)
    return BatchBackend(
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


plugin = BackendPlugin("openai_batch", BatchOptions, build, batched=True, cache=OPENAI_CACHE)
