"""What every LLM stage shares: render -> call -> record (issue 9, point 3).

A stage renders each row's request (the prompt messages and the request id: pure,
``render``), the backend the recipe names makes it (``factory.llm.backends``:
aiohttp, openai, or a plug-in; online backends get each request inside a
concurrency slot, batched ones all waiting requests at once through
``factory.llm.batcher``), and the answer is recorded (``LLMStage.call``: stored in
the response cache before anything else can fail, counted against the budget,
usage, cost and retries written on the row by the pure ``record_completion`` /
``record_failure``). A stage never names a backend: adding one touches none of
the files here, as Ray Data LLM's processors chain a new engine stage between
the same tokenize and detokenize stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory.config import RecipeConfig
from factory.core.trajectory import canonical_json
from factory.engine import watchdog
from factory.engine.prompts import estimate_tokens
from factory.engine.stages.base import UNISSUED, Stage, fail
from factory.errors import ConfigError, LLMError, LLMUnavailable, describe_os_error
from factory.io.cache import ResponseCache, completion_from_record, completion_to_record
from factory.io.runstate import BatchJournal
from factory.llm import Completion, PriceTable
from factory.llm.backends import (
    Backend,
    LLMRequest,
    OnlineBackend,
    build_backend,
    get_backend,
)
from factory.llm.batcher import Batcher
from factory.llm.pricing import Price, cost
from factory.secrets import redact

__all__ = [
    "LLMStage",
    "build_backend_for",
    "build_client",
    "per_actor_concurrency",
    "record_completion",
    "record_failure",
    "render",
    "request_id",
    "reservation",
]


def open_cache(cfg: RecipeConfig) -> ResponseCache | None:
    """The run's response cache (default ``OUTPUT/cache``), or None when disabled."""
    if not cfg.cache.enabled:
        return None
    location = cfg.cache.path or str(Path(cfg.output.dir) / "cache")
    return ResponseCache(location)


def budget_name(cfg: RecipeConfig) -> str:
    """Name of the run's budget actor (one per output folder)."""
    digest = hashlib.sha256(str(Path(cfg.output.dir).resolve()).encode()).hexdigest()[:12]
    return f"factory-budget-{digest}"


def find_budget(cfg: RecipeConfig) -> Any:
    """The run's budget actor, or None when the recipe sets no cap."""
    amp = cfg.amplify
    if amp is None or (
        amp.max_cost_usd is None and amp.max_tokens is None and amp.max_calls is None
    ):
        return None
    import ray

    return ray.get_actor(budget_name(cfg))


def per_actor_concurrency(cfg: RecipeConfig) -> int:
    """Per-actor limit such that all actors together respect ``llm.concurrency``."""
    assert cfg.llm is not None
    return max(
        1, min(cfg.llm.per_actor_concurrency, math.ceil(cfg.llm.concurrency / cfg.ray.actors))
    )


def build_backend_for(cfg: RecipeConfig, model: str) -> Backend:
    """The backend ``llm.backend`` names, for ``model`` (one per actor).

    Raises:
        ConfigError: an unknown backend (naming the choices), bad ``llm.backend_options``,
            bad sampling options, a missing key (naming its variable).
    """
    assert cfg.llm is not None
    prices = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    batched = get_backend(cfg.llm.backend).batched
    return build_backend(
        cfg.llm,
        model,
        concurrency=per_actor_concurrency(cfg),
        # A batch API bills its own (Batch-tier) price: cost and budget count that one.
        price=prices.lookup_batch(model) if batched else prices.lookup(model),
        sleep=wait_without_slot,  # no retry once the run's driver is gone
        batch_journal=BatchJournal(Path(cfg.output.dir)) if batched else None,
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
    text = "".join(str(m.get("content") or "") for m in request.messages)
    prompt = estimate_tokens(text)
    output = max_output if max_output is not None else prompt
    usage = {"prompt_tokens": prompt, "completion_tokens": output}
    return cost(usage, price), prompt + output


def build_client(cfg: RecipeConfig, model: str) -> OnlineBackend:
    """An online backend for ``model``: one request at a time (``factory.evaluate``).

    Raises:
        ConfigError: as ``build_backend_for``, or the backend only takes batches.
    """
    backend = build_backend_for(cfg, model)
    if not isinstance(backend, OnlineBackend):
        raise ConfigError(
            f"backend {cfg.llm.backend if cfg.llm else ''!r} only takes batches; choose an "
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
    prompt_hash = hashlib.sha256(canonical_json(messages).encode()).hexdigest()
    body = canonical_json(
        {"stage": stage, "model": model, "sampling": sampling, "prompt": prompt_hash, **identity}
    )
    return f"{stage}-{hashlib.sha256(body.encode()).hexdigest()[:32]}"


def render(
    stage: str,
    model: str,
    sampling: dict[str, Any],
    messages: list[dict[str, str]],
    **identity: Any,
) -> LLMRequest:
    """The request of one row: its messages under their content-derived id (pure)."""
    return LLMRequest(request_id(stage, model, sampling, messages, **identity), messages)


def usage_record(c: Completion) -> dict[str, int]:
    usage = c.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "cached_tokens": int((details or {}).get("cached_tokens") or 0),
    }


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


def record_completion(row: dict[str, Any], c: Completion, *, cached: bool) -> None:
    """Write an answer on its row: text, usage, cost, attempts, provenance (pure).

    ``cached_responses`` and ``paid_usd`` add up over the row's requests (a judge may
    ask again); a replayed answer was paid by an earlier run, so it adds no spend and
    no retries.
    """
    row["cached"] = cached
    row["cached_responses"] = (row.get("cached_responses") or 0) + int(cached)
    row["paid_usd"] = (row.get("paid_usd") or 0.0) + (0.0 if cached else c.cost_usd)
    row.update(
        completion=c.text,
        usage=json.dumps(usage_record(c)),
        cost_usd=c.cost_usd,
        attempts=c.attempts,
        latency_s=c.latency_s,
        endpoint=c.endpoint,
        fingerprint=c.system_fingerprint,
    )
    if not cached:
        add_retries(row, c.retries)


def record_failure(row: dict[str, Any], stage: str, exc: LLMError) -> None:
    """Write a request that failed after its retries on its row (pure): ``failed``, or
    ``unissued`` when it was never sent (no endpoint took it: a resume sends it)."""
    row["attempts"] = getattr(exc, "attempts", None)
    add_retries(row, getattr(exc, "retries", None))
    if isinstance(exc, LLMUnavailable):
        row.update(status=UNISSUED, stage=stage, reason=exc.reason, message=exc.describe())
    else:
        fail(row, stage, exc.reason, exc.describe())


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
        await watchdog.sleep(delay)
        return
    slot.give_back()
    try:
        await watchdog.sleep(delay)
    finally:
        await slot.take()


class LLMStage(Stage):
    """Base of stages that make LLM calls for their rows (render, then ``call``)."""

    backend: Backend
    cache: ResponseCache | None = None
    budget: Any = None  # the run's BudgetActor handle, when the recipe has caps
    slots: int = 1
    _slots: asyncio.Semaphore | None = None
    _batcher: Batcher | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _cache_error: str | None = None  # set by the first failed cache write: no new call starts
    #: Batched backends: (Batch-tier price, max output tokens) to reserve budget with.
    _reserve_basis: tuple[Price | None, int | None] | None = None

    def attach(self, cfg: RecipeConfig) -> None:
        """Open this actor's view of the run's response cache and find its budget actor."""
        self.cache = open_cache(cfg)
        self.budget = find_budget(cfg)
        self.slots = per_actor_concurrency(cfg)
        if self.backend.batched and self.budget is not None:
            assert cfg.llm is not None
            prices = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
            sampling = cfg.llm.sampling
            max_output = sampling.get("max_completion_tokens") or sampling.get("max_tokens")
            self._reserve_basis = (
                prices.lookup_batch(self.backend.model),
                int(max_output) if max_output else None,
            )

    def close(self) -> None:
        """Close the cache and the backend's sessions (on the loop that opened them)."""
        if self.cache is not None:
            self.cache.close()
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._aclose(), loop).result(timeout=5)
        elif loop is None or loop.is_closed():
            asyncio.run(self._aclose())

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

    async def _spend(self, c: Completion, reserved: tuple[float, int] = (0.0, 0)) -> None:
        if self.budget is not None:
            usage = usage_record(c)
            tokens = usage["prompt_tokens"] + usage["completion_tokens"]
            await self.budget.finish.remote(c.cost_usd, tokens, reserved)

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

    async def _admit(self, row: dict[str, Any], reserved: tuple[float, int] = (0.0, 0)) -> bool:
        """May a new request start? Not when the driver is gone, the cache refused a
        write (its answer could not be stored) or a budget cap is reached (or, for a
        batched request, would be crossed by its ``reserved`` estimate); then the row
        is ``unissued``. A request is counted against the caps only when it starts."""
        watchdog.check()  # the driver is gone: no new request
        if self._cache_error is not None:
            row.update(
                status=UNISSUED,
                stage=self.name,
                reason="cache_write",
                message=f"not sent: the cache refused a write ({self._cache_error})",
            )
            return False
        if self.budget is not None and not await self.budget.try_start.remote(*reserved):
            row.update(
                status=UNISSUED,
                stage=self.name,
                reason="budget",
                message="a budget cap was reached before this call started",
            )
            return False
        return True

    async def _send(self, row: dict[str, Any], request: LLMRequest) -> Completion | None:
        """Admit, send and keep one request: the answer is stored and spent before it is
        returned; None when the row did not get one (unissued or failed)."""
        reserved = (0.0, 0)
        if self._reserve_basis is not None:
            reserved = reservation(request, *self._reserve_basis)
        if not await self._admit(row, reserved):
            return None
        if self._batcher is not None:
            try:
                result = await self._batcher.submit(request)
            except BaseException:
                with contextlib.suppress(Exception):  # the original error is what matters
                    await self._release(reserved)
                raise
        else:
            results = [r async for r in self.backend.run([request])]
            if len(results) != 1 or results[0].request_id != request.request_id:
                raise RuntimeError(
                    f"backend {type(self.backend).__name__} answered {len(results)} results "
                    "for one request"
                )
            result = results[0]
        if result.error is not None:
            await self._release(reserved)
            record_failure(row, self.name, result.error)
            return None
        assert result.completion is not None
        c = redacted(result.completion)
        if self.cache is not None:  # persisted before anything else can go wrong
            self._store(row, request.request_id, c)
        await self._spend(c, reserved)  # (online: inside the slot: the next call sees it)
        return c

    async def _release(self, reserved: tuple[float, int]) -> None:
        """Give back a batched request's reservation: it got no answer, so no bill."""
        if self.budget is not None and reserved != (0.0, 0):
            await self.budget.release.remote(*reserved)

    async def call(self, row: dict[str, Any], request: LLMRequest) -> Completion | None:
        """Make the request (or replay it from the cache) and record it on ``row``.

        Returns None when the row failed (after retries) or the call was never started
        (status ``unissued``: a budget cap, a refused cache write, no endpoint).
        """
        self._loop = asyncio.get_running_loop()
        watchdog.note_loop(self._loop)
        row["request_id"] = request.request_id
        record = self.cache.get(request.request_id) if self.cache is not None else None
        if record is not None:
            c: Completion | None = completion_from_record(record)
            assert c is not None
            await self._spend(c)  # paid by an earlier run; counts towards the caps
            record_completion(row, c, cached=True)
            return c
        if self.backend.batched:
            c = await self._send(row, request)
        else:
            # Take a concurrency slot first, then ask the budget: at most the calls in
            # flight can overshoot a cap.
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
            record_completion(row, c, cached=False)
        return c
