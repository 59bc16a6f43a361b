"""What every LLM stage shares: render -> call -> record (issue 9, point 3).

A stage renders each row's request (the prompt messages and the request id: pure,
``render``), the backend the recipe names makes it (``factory.llm.backends``:
aiohttp, openai, or a plug-in; online backends get each request inside a
concurrency slot, batched ones all waiting requests at once through
``factory.llm.batcher``), and the answer is recorded (``LLMStage.call``: stored in
the response cache before anything else can fail; usage, cost, calls and retries
written on the row by the pure ``record_completion`` / ``record_failure``, which the
driver's ledger sums and checks against the budget caps). Whether a request may go
out at all is the driver's word, passed in as the stage's ``admission``. A stage
never names a backend: adding one touches none of the files here, as Ray Data
LLM's processors chain a new engine stage between the same tokenize and
detokenize stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from factory.core.trajectory import IdentityMemo, canonical_json
from factory.engine import watchdog
from factory.engine.prompts import estimate_tokens
from factory.engine.settings import LLMStageSettings
from factory.engine.stages.base import HURRY, UNISSUED, Stage, fail
from factory.errors import ConfigError, LLMError, LLMStopped, LLMUnavailable, describe_os_error
from factory.io.cache import ResponseCache, completion_from_record, completion_to_record
from factory.io.runstate import BatchJournal
from factory.llm.backends import (
    Backend,
    LLMRequest,
    OnlineBackend,
    build_backend,
)
from factory.llm.backends.openai_wire import tokens_record
from factory.llm.batcher import Batcher
from factory.llm.pricing import Price, cost
from factory.llm.retry import required_wait
from factory.llm.types import Completion, Usage
from factory.secrets import redact

__all__ = [
    "LLMStage",
    "build_backend_for",
    "build_client",
    "messages_digest",
    "record_completion",
    "record_failure",
    "refuse",
    "render",
    "request_id",
    "reservation",
]

CAPS = ("max_calls", "max_cost_usd", "max_tokens")


def build_backend_for(settings: LLMStageSettings) -> Backend:
    """The backend ``llm.backend`` names, for one stage's model (one per actor).

    Raises:
        ConfigError: an unknown backend (naming the choices), bad ``llm.backend_options``,
            bad sampling options, a missing key (naming its variable).
    """
    return build_backend(
        settings.llm,
        settings.model,
        concurrency=settings.slots,
        # A batch API bills its own (Batch-tier) price: cost and budget count that one.
        price=settings.price,
        sleep=wait_without_slot,  # no retry once the run's driver is gone
        before_send=watchdog.check,  # no hedge either
        batch_journal=BatchJournal(settings.out_dir) if settings.batched else None,
        run_dir=str(settings.out_dir),
        actors=settings.actors,
    )


def reservation(
    request: LLMRequest, price: Price | None, max_output: int | None
) -> tuple[float, int]:
    """What a batched request reserves against the budget caps when it is submitted:
    (estimated cost at the Batch-tier ``price``, estimated tokens).

    Prompt tokens are estimated from the messages' text (4 characters a token, no cache
    discount); output tokens are ``max_output`` (the recipe's ``max_completion_tokens``,
    an upper bound) or, without one, as many as the prompt (an amplification answer is
    about as long as the reference it rewrites, which the prompt holds).
    """
    text = "".join(m.content for m in request.messages)
    prompt = estimate_tokens(text)
    output = max_output if max_output is not None else prompt
    return cost(Usage(input=prompt, output=output), price), prompt + output


def build_client(settings: LLMStageSettings) -> OnlineBackend:
    """An online backend for one stage's model: one request at a time (``factory.evaluate``).

    Raises:
        ConfigError: as ``build_backend_for``, or the backend only takes batches.
    """
    backend = build_backend_for(settings)
    if not isinstance(backend, OnlineBackend):
        raise ConfigError(
            f"backend {settings.llm.backend!r} only takes batches; choose an "
            "online one (aiohttp, openai) for this command",
            key_path="llm.backend",
        )
    return backend


def request_id(
    stage: str,
    model: str,
    sampling: dict[str, Any],
    messages: list[dict[str, str]],
    **identity: Any,
) -> str:
    """Content-derived id of one LLM request: same inputs, same id, on every rerun.

    ``identity`` names what the request is for (seed id, variation); the prompt
    hash covers the template, so editing a template changes exactly the ids of
    the requests it renders.
    """
    prompt_hash = messages_digest(messages)
    body = canonical_json(
        {"stage": stage, "model": model, "sampling": sampling, "prompt": prompt_hash, **identity}
    )
    return f"{stage}-{hashlib.sha256(body.encode()).hexdigest()[:32]}"


def messages_digest(messages: list[dict[str, str]]) -> str:
    """``sha256(canonical_json(messages))``, hex, with the hash of a leading system message
    remembered: every request of a stage starts with the same static block (23 KB of an
    amplification prompt's 29 KB), and encoding and hashing it again for every request was
    a worker's largest cost after the HTTP exchange (py-spy, the peer benchmark's S1).
    The digest is the same bytes' either way: request ids, and with them the cache, do not
    change."""
    first = messages[0] if messages else None
    if len(messages) < 2 or not _plain_system(first):
        return hashlib.sha256(canonical_json(messages).encode()).hexdigest()
    assert first is not None
    digest = _system_prefix(first["content"]).copy()
    digest.update((",".join(canonical_json(m) for m in messages[1:]) + "]").encode())
    return digest.hexdigest()


def _plain_system(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.keys() == {"role", "content"}
        and message["role"] == "system"
        and isinstance(message["content"], str)
    )


def _prefix_hash(content: str) -> Any:
    """The hash state after ``[`` and the system message's canonical JSON and ``,``."""
    prefix = "[" + canonical_json({"content": content, "role": "system"}) + ","
    return hashlib.sha256(prefix.encode())


_system_prefix: IdentityMemo[str, Any] = IdentityMemo(_prefix_hash)


def render(
    stage: str,
    model: str,
    sampling: dict[str, Any],
    messages: list[dict[str, str]],
    **identity: Any,
) -> LLMRequest:
    """The request of one row: its messages under their content-derived id (pure).

    A leading system message is the stage's static block (``factory.engine.prompts``:
    it depends only on the domain), marked so a provider may cache it."""
    static = 1 if messages and messages[0].get("role") == "system" else 0
    return LLMRequest.of(
        request_id(stage, model, sampling, messages, **identity),
        messages,
        sampling=sampling,
        static_prefix=static,
    )


def add_retries(row: dict[str, Any], retries: Mapping[str, int] | None) -> None:
    """Add retry counts by reason to the row's ``retries`` (JSON), which the driver sums
    into the manifest: retries are summarised, never one console line each."""
    if not retries:
        return
    counts = Counter(json.loads(row["retries"]) if row.get("retries") else {})
    counts.update(retries)
    row["retries"] = json.dumps(dict(sorted(counts.items())))


def sum_retries(total: Counter[str], row: dict[str, Any]) -> None:
    """Driver side: add one final row's retry counts to the run's."""
    if row.get("retries"):
        total.update(json.loads(row["retries"]))


def redacted(c: Completion) -> Completion:
    """The completion with any secret the model echoed masked: it never reaches a file."""
    return dataclasses.replace(
        c, text=redact(c.text), reasoning=redact(c.reasoning) if c.reasoning else None
    )


def record_completion(row: dict[str, Any], c: Completion, *, cached: bool, stage: str) -> None:
    """Write an answer on its row: text, usage, cost, attempts, provenance (pure).

    ``cached_responses``, ``paid_usd`` and ``calls`` add up over the row's requests (a
    judge may ask again); a replayed answer was paid by an earlier run, so it adds no
    spend, no call and no retries. ``llm_stage`` says whose call the usage is (the
    run's ledger counts tokens and cost per stage).
    """
    row["cached"] = cached
    row["cached_responses"] = (row.get("cached_responses") or 0) + int(cached)
    row["paid_usd"] = (row.get("paid_usd") or 0.0) + (0.0 if cached else c.cost_usd)
    row["calls"] = (row.get("calls") or 0) + int(not cached)
    row.update(
        completion=c.text,
        usage=json.dumps(tokens_record(c.usage)),
        cost_usd=c.cost_usd,
        attempts=c.attempts,
        latency_s=c.latency_s,
        endpoint=c.endpoint,
        fingerprint=c.system_fingerprint,
        llm_stage=stage,
    )
    if not cached:
        add_retries(row, c.retries)


def record_failure(row: dict[str, Any], stage: str, exc: LLMError) -> None:
    """Write a request that failed after its retries on its row (pure): ``failed``, or
    ``unissued`` when it was never sent (no endpoint took it: a resume sends it)."""
    row["attempts"] = getattr(exc, "attempts", None)
    row["llm_stage"] = stage
    add_retries(row, getattr(exc, "retries", None))
    if isinstance(exc, LLMUnavailable):  # never sent, or its retries cut by a stop
        row["calls"] = (row.get("calls") or 0) + int(bool(getattr(exc, "attempts", 0)))
        row.update(status=UNISSUED, stage=stage, reason=exc.reason, message=exc.describe())
    else:
        row["calls"] = (row.get("calls") or 0) + int(bool(getattr(exc, "attempts", 0)))
        fail(row, stage, exc.reason, exc.describe())


def refuse(row: dict[str, Any], stage: str, why: str) -> None:
    """Mark a row whose request was never sent: ``unissued`` with the stop's reason
    (a cap's name becomes reason ``budget``)."""
    if why in CAPS:
        message = f"a budget cap ({why}) was reached before this call started"
    else:
        message = f"not sent: the run stopped issuing calls ({why})"
    row.update(
        status=UNISSUED, stage=stage, reason=stop_reason(why), message=message, llm_stage=stage
    )


def stop_reason(why: str) -> str:
    """The reason an ``unissued`` row carries for a stop: ``budget`` for any cap, else the
    stop's own name (``unreachable``, ``cache_write``, ``interrupted`` ...)."""
    return "budget" if why in CAPS else why


class _Slot:
    """One row's hold on its stage's concurrency semaphore, given back while the row
    only waits (a retry's backoff, a ``Retry-After``, an open circuit breaker)."""

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore = semaphore
        self.held = False

    async def take(self) -> None:
        await self._semaphore.acquire()
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._semaphore.release()


_ROW_SLOT: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("row_slot", default=None)


@dataclasses.dataclass(frozen=True)
class Halt:
    """What a waiting row listens to: the worker's stop (set when the driver stops
    issuing) and why, so a request asleep in a backoff or waiting for a circuit breaker
    gives up at once instead of waiting out its deadline (up to ``llm.deadline.request_s``)."""

    event: asyncio.Event
    reason: Callable[[], str | None]


_ROW_HALT: contextvars.ContextVar[Halt | None] = contextvars.ContextVar("row_halt", default=None)


HURRIED_RETRY_S = 0.05  # a hurried row's wait before its next attempt (no server hint)


async def _pause(delay: float) -> None:
    """Sleep ``delay`` s, less if the run stops meanwhile or the driver hurries this row;
    then refuse to go on if the run stopped.

    A hurried row (``HURRY``: later rows wait for it) drops the backoff's jitter: it waits
    only what the server asked for (``retry.required_wait``) or ``HURRIED_RETRY_S``.
    Why: under a fault storm the run's last rows waited on one row's chain of three or
    four failed attempts with 1 + 2 + 4 (+ 8) s of backoff, long after every other
    result was in; the spread that jitter buys is not needed by the one row everyone
    waits for.

    Raises:
        Interrupted: the driver is gone.
        LLMStopped: the driver stopped issuing (a cap, the target reached, no endpoint
            answering): the row is ``unissued`` and a resume sends it again.
    """
    halt = _ROW_HALT.get()
    hurry = HURRY.get()
    if halt is None and hurry is None:
        await watchdog.sleep(delay)
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + delay
    short = start + max(required_wait(), HURRIED_RETRY_S)
    while True:
        if hurry is not None and hurry.is_set():
            end = min(end, short)
        left = end - loop.time()
        if left <= 0 or (halt is not None and halt.event.is_set()):
            break
        events = [e for e in (halt.event if halt else None, hurry) if e and not e.is_set()]
        await _first_of(events, left)
    watchdog.check()
    why = halt.reason() if halt is not None else None
    if why is not None:
        error = LLMStopped(f"not tried again: the run stopped issuing calls ({why})")
        error.reason = stop_reason(why)  # NOT_NEEDED: the row vanishes, uncounted
        raise error


async def _first_of(events: list[asyncio.Event], timeout: float) -> None:
    """Wait until one of ``events`` is set, at most ``timeout`` s."""
    if not events:
        await asyncio.sleep(timeout)
        return
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def wait_without_slot(delay: float) -> None:
    """The backends' sleep between attempts: the waiting row lends its concurrency slot
    to a row that can be sent, and takes a slot again before its next attempt.

    Why: under a fault storm (issue 8: 20% 429s with ``Retry-After``, 5% 5xx, 2% hung
    attempts) about half of an actor's slots were held by rows asleep in a backoff while
    only 20-30 of 40 requests were on the wire. Attempts on the wire stay bounded by the
    client's own limiter; a row keeps its budget admission while it waits.
    """
    slot = _ROW_SLOT.get()
    if slot is None or not slot.held:
        await _pause(delay)
        return
    slot.give_back()
    try:
        await _pause(delay)
    finally:
        await slot.take()


class LLMStage(Stage):
    """Base of stages that make LLM calls for their rows (render, then ``call``).

    A subclass builds its prompt and calls ``setup(settings)`` in its constructor.
    """

    backend: Backend
    settings: LLMStageSettings
    cache: ResponseCache | None = None
    slots: int = 1
    _slots: asyncio.Semaphore | None = None
    _batcher: Batcher | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _cache_error: str | None = None  # set by the first failed cache write: no new call starts
    halted: asyncio.Event | None = None  # set by the worker: its stop (wakes waiting rows)

    def setup(self, settings: LLMStageSettings) -> None:
        """Build this actor's backend and open its view of the run's response cache."""
        self.settings = settings
        self.model = settings.model
        self.sampling = dict(settings.sampling)
        self.backend = build_backend_for(settings)
        self.cache = ResponseCache(settings.cache) if settings.cache else None
        self.slots = settings.slots

    def close(self) -> None:
        """Close the cache and the backend's sessions (on the loop that opened them)."""
        if self.cache is not None:
            self.cache.close()
        loop = self._loop
        if loop is not None and loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._aclose(), loop).result(timeout=5)
        elif loop is None or loop.is_closed():
            asyncio.run(self._aclose())

    async def aclose(self) -> None:
        if self.cache is not None:
            self.cache.close()
        await self._aclose()

    async def _aclose(self) -> None:
        if self._batcher is not None:
            await self._batcher.aclose()
        await self.backend.aclose()

    async def arun_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.backend.batched:
            return await super().arun_rows(rows)
        if self._batcher is None:
            self._batcher = Batcher(self.backend)
        batcher = self._batcher
        batcher.enter(len(rows))  # the batch goes out once all of them wait or are done

        async def one(row: dict[str, Any]) -> dict[str, Any]:
            try:
                return await self.arun_one(row)
            finally:
                batcher.leave()

        return list(await asyncio.gather(*(one(r) for r in rows)))

    def _store(self, row: dict[str, Any], rid: str, c: Completion) -> None:
        """Put the paid response in the cache. If the cache refuses (disk full,
        read-only), the response rides on the row (``unstored``) to the driver, which
        keeps it and stops the run; this actor starts no new call (its answers could
        not be stored either). The row itself goes on: the answer is used, counted and
        billed like any other."""
        assert self.cache is not None
        record = completion_to_record(c)
        try:
            self.cache.put(rid, record)
        except OSError as exc:
            where = exc.filename or self.cache.location
            self._cache_error = f"{where}: {describe_os_error(exc)}"
            row["unstored"] = json.dumps(
                {"request_id": rid, "record": record, "error": self._cache_error}
            )

    def _admit(self, row: dict[str, Any]) -> bool:
        """May a new request start? Not when the driver is gone, the cache refused a
        write (its answer could not be stored) or the driver stopped issuing (a budget
        cap, the target reached); then the row is ``unissued``."""
        watchdog.check()  # the driver is gone: no new request
        if self._cache_error is not None:
            row.update(
                status=UNISSUED,
                stage=self.name,
                reason="cache_write",
                message=f"not sent: the cache refused a write ({self._cache_error})",
            )
            return False
        why = self.admission() if self.admission is not None else None
        if why is not None:
            refuse(row, self.name, why)
            return False
        return True

    async def _send(self, row: dict[str, Any], request: LLMRequest) -> Completion | None:
        """Admit, send and keep one request: the answer is stored before it is
        returned; None when the row did not get one (unissued or failed)."""
        if not self._admit(row):
            return None
        if self._batcher is not None:
            result = await self._batcher.submit(request)
        else:
            results = [r async for r in self.backend.run([request])]
            if len(results) != 1 or results[0].request_id != request.request_id:
                raise RuntimeError(
                    f"backend {type(self.backend).__name__} answered {len(results)} results "
                    "for one request"
                )
            result = results[0]
        if result.error is not None:
            record_failure(row, self.name, result.error)
            return None
        assert result.completion is not None
        c = redacted(result.completion)
        if self.cache is not None:  # persisted before anything else can go wrong
            self._store(row, request.request_id, c)
        return c

    async def call(self, row: dict[str, Any], request: LLMRequest) -> Completion | None:
        """Make the request (or replay it from the cache) and record it on ``row``.

        Returns None when the row failed (after retries) or the call was never started
        (status ``unissued``: a stop, a refused cache write, no endpoint).
        """
        self._loop = asyncio.get_running_loop()
        watchdog.note_loop(self._loop)
        if self.halted is not None and self.admission is not None:
            _ROW_HALT.set(Halt(self.halted, self.admission))  # this row's task only
        row["request_id"] = request.request_id
        record = self.cache.get(request.request_id) if self.cache is not None else None
        if record is not None:
            c: Completion | None = completion_from_record(record)
            assert c is not None
            record_completion(row, c, cached=True, stage=self.name)
            return c
        if self.backend.batched:
            c = await self._send(row, request)
        else:
            # A concurrency slot first, then the admission: a request refused by a stop
            # never waited for a slot it did not need, and at most the requests in the
            # slots go out after a stop.
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.slots)
            slot = _Slot(self._slots)
            token = _ROW_SLOT.set(slot)
            try:
                await slot.take()
                c = await self._send(row, request)
            finally:
                slot.give_back()
                _ROW_SLOT.reset(token)
        if c is not None:
            record_completion(row, c, cached=False, stage=self.name)
        return c
