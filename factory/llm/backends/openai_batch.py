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
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from pydantic import Field

from factory.errors import ConfigError, LLMError, LLMServerError
from factory.llm.backends.base import (
    OPENAI_CACHE,
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
    BatchJournal,
    LLMRequest,
    LLMResult,
)
from factory.llm.backends.openai_wire import chat_messages, completion_from_openai
from factory.llm.client import resolve_api_key
from factory.llm.errormap import status_error
from factory.llm.params import build_request
from factory.llm.pool import Endpoint
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

log = logging.getLogger(__name__)

MAX_REQUESTS_PER_FILE = 50_000
MAX_FILE_MB = 200.0
LIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
_CONTROL_ATTEMPTS = 8  # upload / create / poll calls before a batch's requests fail


class BatchOptions(BackendOptions):
    """``llm.backend_options`` of ``openai_batch``."""

    poll_interval_s: float = Field(
        30.0, gt=0, description="First wait before polling a batch; grows by poll_backoff."
    )
    poll_backoff: float = Field(1.5, ge=1, description="Factor between two polls of a batch.")
    poll_max_s: float = Field(300.0, gt=0, description="Longest wait between two polls.")
    max_requests_per_file: int = Field(
        MAX_REQUESTS_PER_FILE, ge=1, le=MAX_REQUESTS_PER_FILE, description="Requests per batch."
    )
    max_file_mb: float = Field(
        MAX_FILE_MB, gt=0, le=MAX_FILE_MB, description="Size of one input file, in MB."
    )


class MemoryJournal:
    """A batch journal that lives as long as the backend (no output folder: tests)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def load(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.entries.values()]

    def save(self, entry: Mapping[str, Any]) -> None:
        self.entries[str(entry["key"])] = dict(entry)


def split_requests(lines: Sequence[bytes], max_requests: int, max_bytes: int) -> list[list[int]]:
    """Indexes of ``lines`` grouped into input files within both limits (pure).

    Raises:
        ValueError: one line alone is larger than ``max_bytes``.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, line in enumerate(lines):
        n = len(line) + 1
        if n > max_bytes:
            raise ValueError(f"one request is {n} bytes, more than a batch file may hold")
        if current and (len(current) >= max_requests or size + n > max_bytes):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        groups.append(current)
    return groups


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


class _ControlError(Exception):
    """A Files/Batches call failed after its attempts (carries the LLMError)."""

    def __init__(self, error: LLMError):
        super().__init__(str(error))
        self.error = error


class BatchBackend(Backend):
    """Requests through ``/v1/files`` and ``/v1/batches`` of one OpenAI-compatible server."""

    batched = True

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
        self.base_url = base_url.rstrip("/")
        self.endpoint = Endpoint(base_url=base_url).name
        self.model = model
        self._api_key = api_key
        self._sampling = dict(sampling)
        self._price = price
        self.options = options
        self.max_submissions = max(1, max_submissions)
        self.journal: BatchJournal = journal if journal is not None else MemoryJournal()
        self._sleep = sleep
        self._entries: dict[str, dict[str, Any]] | None = None
        self._index: dict[str, list[str]] = {}  # request id -> keys of its batches
        self._outputs: dict[str, dict[str, Completion | LLMError]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._totals: dict[str, float] = {"calls": 0, "failed": 0, "batches": 0, "cost_usd": 0.0}

    # -- the journal -------------------------------------------------------------------
    def _journal(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = {}
            for entry in self.journal.load():
                self._remember(dict(entry))
        return self._entries

    def _remember(self, entry: dict[str, Any]) -> None:
        assert self._entries is not None
        if entry["key"] not in self._entries:
            for rid in entry["request_ids"]:
                self._index.setdefault(rid, []).append(entry["key"])
        self._entries[entry["key"]] = entry

    def _save(self, entry: dict[str, Any]) -> None:
        self._journal()
        self._remember(entry)
        self.journal.save(entry)

    def _batches_of(self, rid: str) -> list[dict[str, Any]]:
        """The batches holding ``rid`` (an index: a 90k-request run asks 90k times)."""
        entries = self._journal()
        return [entries[key] for key in self._index.get(rid, ())]

    # -- HTTP ----------------------------------------------------------------------------
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self._api_key}"},
                timeout=aiohttp.ClientTimeout(total=600),
            )
        return self._session

    async def _call(self, method: str, path: str, *, raw: bool = False, **kw: Any) -> Any:
        """One Files/Batches call, retried on 429, 5xx and connection failures."""
        delay = 1.0
        for attempt in range(1, _CONTROL_ATTEMPTS + 1):
            try:
                async with self._http().request(method, self.base_url + path, **kw) as resp:
                    body = await resp.read()
                    if resp.status < 400:
                        return body if raw else json.loads(body)
                    try:
                        detail = str(json.loads(body)["error"]["message"])
                    except (ValueError, KeyError, TypeError):
                        detail = body[:200].decode("utf-8", "replace")
                    err: LLMError = status_error(self.endpoint, resp.status, redact(detail)[:300])
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                err = LLMServerError(f"{self.endpoint}: {path}: {type(exc).__name__}: {exc}")
            if not err.retryable or attempt == _CONTROL_ATTEMPTS:
                raise _ControlError(err)
            await self._sleep(delay)
            delay = min(delay * 2, 60.0)
        raise AssertionError("unreachable")

    # -- submitting ----------------------------------------------------------------------
    def _line(self, request: LLMRequest) -> bytes:
        sampling = self._sampling if request.sampling is None else dict(request.sampling)
        body = build_request(self.model, chat_messages(request.messages), sampling)
        line = {
            "custom_id": request.request_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()

    async def _submit(self, requests: Sequence[LLMRequest]) -> list[dict[str, Any]]:
        """Upload and create the batches of ``requests``; their journal entries."""
        lines = [self._line(r) for r in requests]
        groups = split_requests(
            lines, self.options.max_requests_per_file, int(self.options.max_file_mb * 1024**2)
        )
        entries = []
        for group in groups:
            data = b"\n".join(lines[i] for i in group) + b"\n"
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", data, filename="requests.jsonl",
                           content_type="application/jsonl")  # fmt: skip
            uploaded = await self._call("POST", "/files", data=form)
            entry = {
                "key": uuid.uuid4().hex,
                "batch_id": None,
                "input_file_id": uploaded["id"],
                "request_ids": [requests[i].request_id for i in group],
                "model": self.model,
                "status": "submitting",
                "request_counts": {"total": len(group), "completed": 0, "failed": 0},
                "submitted_at": time.time(),
            }
            self._save(entry)  # before the batch exists: a crash now is found by input file
            await self._create(entry)
            entries.append(entry)
        return entries

    async def _create(self, entry: dict[str, Any]) -> None:
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
        self._update(entry, batch)
        self._totals["batches"] += 1
        log.info("batch %s submitted: %d requests", batch["id"], len(entry["request_ids"]))

    def _update(self, entry: dict[str, Any], batch: Mapping[str, Any]) -> None:
        changed = entry.get("status") != batch.get("status") or entry.get(
            "request_counts"
        ) != batch.get("request_counts")
        entry.update(
            batch_id=batch["id"],
            status=batch.get("status"),
            request_counts=batch.get("request_counts") or entry.get("request_counts"),
            output_file_id=batch.get("output_file_id"),
            error_file_id=batch.get("error_file_id"),
            errors=batch.get("errors"),
        )
        if changed:
            self._save(entry)
            counts = entry["request_counts"] or {}
            log.info(
                "batch %s %s: %s/%s done, %s failed", batch["id"], entry["status"],
                counts.get("completed"), counts.get("total"), counts.get("failed"),
            )  # fmt: skip

    async def _attach(self, entry: dict[str, Any]) -> None:
        """A batch whose creation a crashed run never confirmed: find it, else create it."""
        listing = await self._call("GET", "/batches", params={"limit": "100"})
        for batch in listing.get("data") or []:
            if batch.get("input_file_id") == entry["input_file_id"]:
                self._update(entry, batch)
                return
        await self._create(entry)

    # -- waiting and reading -------------------------------------------------------------
    async def _results(self, entry: dict[str, Any]) -> dict[str, Completion | LLMError]:
        """Wait for the batch to end; its result per request id (missing: not answered)."""
        if entry.get("batch_id") is None:
            await self._attach(entry)
        bid = entry["batch_id"]
        if bid in self._outputs:
            return self._outputs[bid]
        wait = self.options.poll_interval_s
        while entry.get("status") not in TERMINAL:
            await self._sleep(wait)
            wait = min(wait * self.options.poll_backoff, self.options.poll_max_s)
            self._update(entry, await self._call("GET", f"/batches/{bid}"))
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
        self._outputs[bid] = results
        return results

    def _not_answered(self, entry: Mapping[str, Any]) -> LLMError:
        errors = ((entry.get("errors") or {}).get("data") or [{}])[0]
        why = errors.get("message") or "no line for this request in its output or error file"
        return LLMServerError(
            f"{self.endpoint}: batch {entry.get('batch_id')} ended {entry.get('status')}: "
            f"{redact(str(why))[:200]}"
        )

    async def run(self, requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
        pending = {r.request_id: r for r in requests}
        queue: asyncio.Queue[tuple[dict[str, Any], dict[str, Completion | LLMError] | None]]
        queue = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        waiting: dict[str, int] = {}  # batches a request waits for
        last_error: dict[str, LLMError] = {}

        def watch(entry: dict[str, Any]) -> None:
            async def go() -> None:
                try:
                    results = await self._results(entry)
                except _ControlError as exc:
                    last = exc.error
                    results = {rid: last for rid in entry["request_ids"]}
                await queue.put((entry, results))

            task = asyncio.ensure_future(go())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            for rid in entry["request_ids"]:
                if rid in pending:
                    waiting[rid] = waiting.get(rid, 0) + 1

        async def submit(batch: list[LLMRequest]) -> list[LLMResult]:
            try:
                for entry in await self._submit(batch):
                    watch(entry)
            except _ControlError as exc:  # could not submit them: they fail as they are
                return [LLMResult(r.request_id, error=exc.error) for r in batch]
            return []

        try:
            fresh = []
            attach: dict[str, dict[str, Any]] = {}
            for request in requests:
                known = self._batches_of(request.request_id)
                if not known:
                    fresh.append(request)
                attach.update((e["key"], e) for e in known)
            for entry in attach.values():  # re-attach, once per batch: never submitted again
                watch(entry)
            if fresh:
                for result in await submit(fresh):
                    pending.pop(result.request_id, None)
                    self._totals["failed"] += 1
                    yield result
            while pending and (tasks or not queue.empty()):
                entry, results = await queue.get()
                again: list[LLMRequest] = []
                for rid in entry["request_ids"]:
                    if rid not in pending:
                        continue
                    got = (results or {}).get(rid) or self._not_answered(entry)
                    if isinstance(got, Completion):
                        pending.pop(rid)
                        waiting.pop(rid, None)
                        self._totals["calls"] += 1
                        self._totals["cost_usd"] += got.cost_usd
                        yield LLMResult(rid, completion=got)
                        continue
                    last_error[rid] = got
                    waiting[rid] -= 1
                    if waiting[rid] > 0:
                        continue  # another batch holding it may still answer
                    submissions = len(self._batches_of(rid))
                    if got.retryable and submissions < self.max_submissions:
                        again.append(pending[rid])
                        continue
                    pending.pop(rid)
                    self._totals["failed"] += 1
                    got.attempts = submissions  # type: ignore[attr-defined]
                    yield LLMResult(rid, error=got)
                if again:
                    for result in await submit(again):
                        pending.pop(result.request_id, None)
                        self._totals["failed"] += 1
                        yield result
            for rid in list(pending):  # every watched batch ended without a word on it
                err = last_error.get(rid) or LLMServerError(f"{self.endpoint}: no batch result")
                yield LLMResult(rid, error=err)
        finally:
            for task in tasks:
                task.cancel()

    def totals(self) -> Mapping[str, float]:
        return dict(self._totals)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def build(setup: BackendSetup) -> Backend:
    """A Batch API backend for ``setup.model``.

    Raises:
        ConfigError: ``llm.endpoints`` lists more than one endpoint (a batch, its files
            and its journal entry live on one account: spreading them would need one
            journal per endpoint, and the second endpoint would otherwise be ignored).
    """
    llm = setup.llm
    if len(llm.endpoints) > 1:
        raise ConfigError(
            f"the Batch API backend submits every batch to one endpoint; {len(llm.endpoints)} "
            "are listed (keep one, or use an online backend to spread calls over several)",
            key_path="llm.endpoints",
        )
    endpoint = llm.endpoints[0]
    options = setup.options
    assert isinstance(options, BatchOptions)
    api_key = resolve_api_key(
        Endpoint(base_url=endpoint.base_url, api_key_env=endpoint.api_key_env)
    )
    build_request(setup.model, [], llm.sampling)  # bad sampling options fail here, by key
    return BatchBackend(
        base_url=endpoint.base_url,
        api_key=api_key,
        model=setup.model,
        sampling=llm.sampling,
        price=setup.price,
        options=options,
        max_submissions=llm.retry.max_attempts,
        journal=setup.batch_journal,
        sleep=setup.sleep,
    )


plugin = BackendPlugin("openai_batch", BatchOptions, build, batched=True, cache=OPENAI_CACHE)
