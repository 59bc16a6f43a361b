"""What every provider's batch API shares: journal, split, submit, attach, poll, resubmit.

Why one lifecycle: OpenAI's Batch API, Anthropic's Message Batches and Gemini's Batch
API take the same work at half price and differ only on the wire (how a batch is
created, what its status says, where its results are). The guarantees a run relies on
are the same for all three (issue 35, point 3) and live here, once:

- **Journal first.** Every batch is written to the run's batch journal
  (``factory.io.runstate.BatchJournal``, ``OUT/batches/``) *before* it is created (its
  request ids, and the custom ids they travel under), again once created and whenever
  its status changes. A request the journal places in a batch is never submitted again
  while that batch lives: a restarted driver's actors re-attach to it (each batch
  watched once). A batch whose creation was not confirmed (the driver died between the
  create call and the journal write) is looked for at the provider
  (:meth:`BatchLifecycle._find`), else created then.
- **Within the limits.** A provider's requests per batch and bytes per batch; a batch
  beyond them is split (:func:`split_requests`).
- **Polled with backoff** (``poll_interval_s``, ``poll_backoff``, ``poll_max_s``); a
  control call (create, poll, read results) is retried on 429, 5xx and connection
  failures.
- **Partial results kept.** A batch that ended expired, cancelled or failed keeps the
  answers it has; a request it did not answer, or answered with a retryable error, is
  submitted again while its submissions stay within ``llm.retry.max_attempts``, else it
  is a failed row with the reason (another 4xx fails at once).
- **Money.** The engine builds a batched backend with the Batch-tier price
  (``PriceTable.lookup_batch``) and admits (counts) each request when it is submitted;
  every answer is priced here at that price.

A provider is a subclass of :class:`BatchLifecycle` that writes the hooks (the provider
protocol): :meth:`~BatchLifecycle._line` (one request as the provider takes it),
:meth:`~BatchLifecycle._create` (a batch of lines), :meth:`~BatchLifecycle._find` (a
batch a crashed run created but never recorded), :meth:`~BatchLifecycle._poll` (its
status as a :class:`BatchState` in neutral words), :meth:`~BatchLifecycle._read` (its
results by custom id) and :meth:`~BatchLifecycle._limits`. This module defines no
``plugin``: it is not a backend (``openai_batch``, ``anthropic_batch`` and
``gemini_batch`` are).

The journal's ``status`` is neutral (OpenAI's words): live ``submitting``, ``validating``,
``in_progress``, ``finalizing``, ``cancelling``; ended ``completed``, ``failed``,
``expired``, ``cancelled``; ``request_counts`` are ``{total, completed, failed}``
(``factory.io.runstate.batch_summary`` reads them for the manifest and the console). The
provider's own status word is kept beside them (``provider_status``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from pydantic import Field

from factory.errors import ConfigError, LLMError, LLMServerError
from factory.llm.backends.base import (
    Backend,
    BackendOptions,
    BackendSetup,
    BatchJournal,
    LLMRequest,
    LLMResult,
)
from factory.llm.backends.online import recipe_endpoints
from factory.llm.client import resolve_api_key
from factory.llm.errormap import status_error
from factory.llm.pool import Endpoint
from factory.llm.pricing import Price, cost
from factory.llm.types import Completion
from factory.secrets import redact

__all__ = [
    "LIVE",
    "TERMINAL",
    "BatchLifecycle",
    "BatchState",
    "BatchingOptions",
    "ControlError",
    "MemoryJournal",
    "batch_endpoint",
    "split_requests",
]

log = logging.getLogger(__name__)

LIVE = ("submitting", "validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
_CONTROL_ATTEMPTS = 8  # create / poll / read calls before a batch's requests fail


class BatchingOptions(BackendOptions):
    """The ``llm.backend_options`` every batch backend takes (polling)."""

    poll_interval_s: float = Field(
        30.0, gt=0, description="First wait before polling a batch; grows by poll_backoff."
    )
    poll_backoff: float = Field(1.5, ge=1, description="Factor between two polls of a batch.")
    poll_max_s: float = Field(300.0, gt=0, description="Longest wait between two polls.")


class MemoryJournal:
    """A batch journal that lives as long as the backend (no output folder: tests)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def load(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.entries.values()]

    def save(self, entry: Mapping[str, Any]) -> None:
        self.entries[str(entry["key"])] = dict(entry)


def split_requests(lines: Sequence[bytes], max_requests: int, max_bytes: int) -> list[list[int]]:
    """Indexes of ``lines`` grouped into batches within both limits (pure; each line
    counts one byte more, its newline or comma).

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


def batch_endpoint(setup: BackendSetup, default: Endpoint | None = None) -> tuple[str, str]:
    """The one endpoint a batch backend submits to, and its key: the recipe's, or
    ``default`` (the provider's own API) where it names none.

    Raises:
        ConfigError: ``llm.endpoints`` lists more than one endpoint (a batch, its files
            and its journal entry live on one account: spreading them would need one
            journal per endpoint, and the second endpoint would otherwise be ignored),
            or the endpoint's key variable is unset.
    """
    endpoints = recipe_endpoints(setup, default)
    if len(endpoints) > 1:
        raise ConfigError(
            f"a batch API backend submits every batch to one endpoint; {len(endpoints)} "
            "are listed (keep one, or use an online backend to spread calls over several)",
            key_path="llm.endpoints",
        )
    endpoint = endpoints[0]
    return endpoint.base_url, resolve_api_key(endpoint)


@dataclasses.dataclass(frozen=True)
class BatchState:
    """A provider's batch as the lifecycle reads it.

    Attributes:
        batch_id: the provider's id of the batch.
        status: neutral: one of :data:`LIVE` or :data:`TERMINAL`.
        counts: ``{total, completed, failed}`` as far as the provider says.
        fields: the provider's fields kept in the journal entry (where its results are,
            its own status word); JSON-able.
        error: why the batch as a whole failed or ended early, if the provider says.
    """

    batch_id: str
    status: str
    counts: Mapping[str, int] | None = None
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


class ControlError(Exception):
    """A create/poll/read call failed after its attempts (carries the LLMError)."""

    def __init__(self, error: LLMError):
        super().__init__(str(error))
        self.error = error


class BatchLifecycle(Backend):
    """A batched backend over one provider's batch API (see the module docstring).

    Subclasses set their HTTP headers (:meth:`_headers`) and write the provider hooks.
    """

    batched = True

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        sampling: Mapping[str, Any],
        price: Price | None,
        options: BatchingOptions,
        max_submissions: int,
        journal: BatchJournal | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ):
        self.base_url = base_url.rstrip("/")
        self.endpoint = Endpoint(base_url=base_url).name
        self.model = model
        self._api_key = api_key  # for :meth:`_headers`
        self._sampling = dict(sampling)  # a request's own sampling wins (``request.sampling``)
        self._price = price
        self.options = options
        self.max_submissions = max(1, max_submissions)
        self.journal: BatchJournal = journal if journal is not None else MemoryJournal()
        self._sleep = sleep
        self._entries: dict[str, dict[str, Any]] | None = None
        self._index: dict[str, list[str]] = {}  # request id -> keys of its batches
        self._outputs: dict[str, dict[str, Completion | LLMError]] = {}  # by entry key
        self._lines: dict[str, list[bytes]] = {}  # entry key -> its lines, until created
        self._requests: dict[str, LLMRequest] = {}  # the requests handed to run()
        self._session: aiohttp.ClientSession | None = None
        self._totals: dict[str, float] = {"calls": 0, "failed": 0, "batches": 0, "cost_usd": 0.0}

    # -- the provider protocol ----------------------------------------------------------
    @abstractmethod
    def _headers(self) -> dict[str, str]:
        """The headers of every control call (the key among them)."""

    @abstractmethod
    def _limits(self) -> tuple[int, int]:
        """(requests, bytes) one batch may hold, as :func:`split_requests` counts them."""

    @abstractmethod
    def _line(self, request: LLMRequest, custom_id: str) -> bytes:
        """One request as the provider takes it in a batch, under ``custom_id`` (JSON)."""

    def _custom_id(self, request_id: str) -> str:
        """The id a request travels under (kept in the journal when it differs)."""
        return request_id

    async def _prepare(self, entry: dict[str, Any], lines: list[bytes]) -> None:
        """Before the journal write: what the batch needs first (an uploaded input file,
        whose id lets :meth:`_find` know the batch again). Default: nothing."""

    @abstractmethod
    async def _create(self, entry: dict[str, Any], lines: list[bytes] | None) -> BatchState | None:
        """Create the batch of ``entry``; None when it cannot (``lines`` is None: a
        restarted run that does not hold those requests, and the provider keeps no
        input of its own).

        Raises:
            ControlError: the provider refused or could not be reached.
        """

    @abstractmethod
    async def _find(self, entry: dict[str, Any], claimed: set[str]) -> BatchState | None:
        """The batch of ``entry`` if the provider created it although the journal never
        got its id (``claimed``: the batch ids the journal knows, never the answer)."""

    @abstractmethod
    async def _poll(self, entry: dict[str, Any]) -> BatchState:
        """The batch's state now."""

    @abstractmethod
    async def _read(self, entry: dict[str, Any]) -> dict[str, Completion | LLMError]:
        """An ended batch's results by custom id (a request with none: not answered).
        Completions need no price: the lifecycle prices them."""

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
                headers=self._headers(), timeout=aiohttp.ClientTimeout(total=600)
            )
        return self._session

    def _url(self, path: str) -> str:
        """``path`` under the base URL; a full URL only on the base URL's own origin
        (a URL a provider returns, such as a results URL, never gets the key elsewhere)."""
        if "://" not in path:
            return self.base_url + path
        origin = self.base_url.split("://", 1)
        theirs = path.split("://", 1)
        if theirs[0] != origin[0] or theirs[1].split("/", 1)[0] != origin[1].split("/", 1)[0]:
            raise ControlError(
                LLMServerError(f"{self.endpoint}: refusing a URL on another host: {path[:80]}")
            )
        return path

    async def _call(self, method: str, path: str, *, raw: bool = False, **kw: Any) -> Any:
        """One control call, retried on 429, 5xx and connection failures.

        Raises:
            ControlError: it failed for good (a 4xx, or the attempts ran out).
        """
        delay = 1.0
        for attempt in range(1, _CONTROL_ATTEMPTS + 1):
            try:
                async with self._http().request(method, self._url(path), **kw) as resp:
                    body = await resp.read()
                    if resp.status < 400:
                        return body if raw else json.loads(body)
                    try:  # OpenAI's, Anthropic's and Google's error bodies agree on this
                        detail = str(json.loads(body)["error"]["message"])
                    except (ValueError, KeyError, TypeError):
                        detail = body[:200].decode("utf-8", "replace")
                    err: LLMError = status_error(self.endpoint, resp.status, redact(detail)[:300])
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                err = LLMServerError(f"{self.endpoint}: {method} {path.split('?')[0][:80]}: "
                                     f"{type(exc).__name__}: {exc}")  # fmt: skip
            if not err.retryable or attempt == _CONTROL_ATTEMPTS:
                raise ControlError(err)
            await self._sleep(delay)
            delay = min(delay * 2, 60.0)
        raise AssertionError("unreachable")

    # -- submitting ----------------------------------------------------------------------
    async def _submit(self, requests: Sequence[LLMRequest]) -> list[dict[str, Any]]:
        """Journal and create the batches of ``requests``; their journal entries."""
        custom = [self._custom_id(r.request_id) for r in requests]
        if len(set(custom)) != len(custom):  # a provider's mapping must stay one-to-one
            raise ValueError("two requests of one batch map to the same custom id")
        lines = [self._line(r, c) for r, c in zip(requests, custom, strict=True)]
        max_requests, max_bytes = self._limits()
        entries = []
        for group in split_requests(lines, max_requests, max_bytes):
            rids = [requests[i].request_id for i in group]
            entry: dict[str, Any] = {
                "key": uuid.uuid4().hex,
                "batch_id": None,
                "request_ids": rids,
                "model": self.model,
                "status": "submitting",
                "request_counts": {"total": len(group), "completed": 0, "failed": 0},
                "submitted_at": time.time(),
            }
            if any(custom[i] != requests[i].request_id for i in group):
                entry["custom_ids"] = [custom[i] for i in group]
            chunk = [lines[i] for i in group]
            await self._prepare(entry, chunk)
            self._save(entry)  # before the batch exists: a crash now is found by _find
            self._lines[entry["key"]] = chunk
            await self._created(entry, chunk)
            entries.append(entry)
        return entries

    async def _created(self, entry: dict[str, Any], lines: list[bytes] | None) -> None:
        state = await self._create(entry, lines)
        self._lines.pop(entry["key"], None)
        if state is None:
            entry.update(status="failed", error="its creation was never confirmed and the "
                         "provider holds no such batch")  # fmt: skip
            self._save(entry)
            return
        self._update(entry, state)
        self._totals["batches"] += 1
        log.info("batch %s submitted: %d requests", state.batch_id, len(entry["request_ids"]))

    def _update(self, entry: dict[str, Any], state: BatchState) -> None:
        counts = dict(state.counts) if state.counts is not None else entry.get("request_counts")
        changed = (
            entry.get("batch_id") != state.batch_id
            or entry.get("status") != state.status
            or entry.get("request_counts") != counts
        )
        entry.update(state.fields)
        entry.update(
            batch_id=state.batch_id, status=state.status, request_counts=counts, error=state.error
        )
        if changed:
            self._save(entry)
            c = counts or {}
            log.info(
                "batch %s %s: %s/%s done, %s failed", state.batch_id, state.status,
                c.get("completed"), c.get("total"), c.get("failed"),
            )  # fmt: skip

    async def _attach(self, entry: dict[str, Any]) -> None:
        """A batch whose creation a crashed run never confirmed: find it, else create it."""
        claimed = {str(e["batch_id"]) for e in self._journal().values() if e.get("batch_id")}
        found = await self._find(entry, claimed)
        if found is not None:
            self._update(entry, found)
            return
        lines = self._lines.get(entry["key"])
        if lines is None and all(rid in self._requests for rid in entry["request_ids"]):
            custom = entry.get("custom_ids") or entry["request_ids"]
            lines = [
                self._line(self._requests[rid], cid)
                for rid, cid in zip(entry["request_ids"], custom, strict=True)
            ]
        await self._created(entry, lines)

    # -- waiting and reading -------------------------------------------------------------
    async def _results(self, entry: dict[str, Any]) -> dict[str, Completion | LLMError]:
        """Wait for the batch to end; its result per request id (missing: not answered)."""
        if entry.get("batch_id") is None and entry.get("status") not in TERMINAL:
            await self._attach(entry)
        if entry["key"] in self._outputs:
            return self._outputs[entry["key"]]
        wait = self.options.poll_interval_s
        while entry.get("status") not in TERMINAL:
            await self._sleep(wait)
            wait = min(wait * self.options.poll_backoff, self.options.poll_max_s)
            self._update(entry, await self._poll(entry))
        results: dict[str, Completion | LLMError] = {}
        if entry.get("batch_id") is not None:
            rid_of = dict(zip(entry.get("custom_ids") or entry["request_ids"],
                              entry["request_ids"], strict=True))  # fmt: skip
            strangers = 0
            for cid, got in (await self._read(entry)).items():
                rid = rid_of.get(cid)
                if rid is None:
                    strangers += 1
                    continue
                if isinstance(got, Completion):
                    priced = cost(got.usage, self._price)
                    got = dataclasses.replace(got, cost_usd=priced, attempts=1)
                results[rid] = got
            if strangers:
                log.warning("batch %s holds %d results its journal entry does not name; "
                            "ignored", entry["batch_id"], strangers)  # fmt: skip
        self._outputs[entry["key"]] = results
        return results

    def _not_answered(self, entry: Mapping[str, Any]) -> LLMError:
        why = entry.get("error") or "no result for this request in the batch's output"
        return LLMServerError(
            f"{self.endpoint}: batch {entry.get('batch_id')} ended {entry.get('status')}: "
            f"{redact(str(why))[:200]}"
        )

    async def run(self, requests: Sequence[LLMRequest]) -> AsyncIterator[LLMResult]:
        pending = {r.request_id: r for r in requests}
        self._requests.update(pending)
        queue: asyncio.Queue[tuple[dict[str, Any], dict[str, Completion | LLMError] | None]]
        queue = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        waiting: dict[str, int] = {}  # batches a request waits for
        last_error: dict[str, LLMError] = {}

        def watch(entry: dict[str, Any]) -> None:
            async def go() -> None:
                try:
                    results = await self._results(entry)
                except ControlError as exc:
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
            except ControlError as exc:  # could not submit them: they fail as they are
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
            for request in requests:
                self._requests.pop(request.request_id, None)

    def totals(self) -> Mapping[str, float]:
        return dict(self._totals)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
