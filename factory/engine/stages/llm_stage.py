"""What every LLM stage shares: building the client from the recipe, request ids,
and recording a completion (or its failure) on the row."""

from __future__ import annotations

import asyncio
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
from factory.engine.stages.base import UNISSUED, Stage, fail
from factory.errors import LLMError, LLMUnavailable, describe_os_error
from factory.io.cache import ResponseCache, completion_from_record, completion_to_record
from factory.llm import (
    AttemptDeadline,
    Completion,
    Endpoint,
    EndpointPool,
    LLMClient,
    PriceTable,
    RetryPolicy,
    openai_client_factory,
)
from factory.llm.http import aiohttp_client_factory
from factory.secrets import redact

__all__ = ["LLMStage", "build_client", "per_actor_concurrency", "request_id"]


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


def build_client(cfg: RecipeConfig, model: str) -> LLMClient:
    """An ``LLMClient`` for ``model`` over the recipe's endpoints (one per actor)."""
    assert cfg.llm is not None
    llm = cfg.llm
    pool = EndpointPool(
        [
            Endpoint(base_url=e.base_url, api_key_env=e.api_key_env, weight=e.weight)
            for e in llm.endpoints
        ]
    )
    deadline = AttemptDeadline(
        llm.timeout_s,
        floor_s=llm.deadline.floor_s,
        p99_factor=llm.deadline.p99_factor,
        min_samples=llm.deadline.min_samples,
        window=llm.deadline.window,
        adaptive=llm.deadline.adaptive,
    )
    retry = RetryPolicy(
        max_attempts=llm.retry.max_attempts,
        base_delay=llm.retry.base_delay_s,
        max_delay=llm.retry.max_delay_s,
    )
    prices = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    factory = aiohttp_client_factory if llm.transport == "aiohttp" else openai_client_factory
    return LLMClient(
        pool,
        model,
        llm.sampling,
        concurrency=per_actor_concurrency(cfg),
        timeout_s=llm.timeout_s,
        retry=retry,
        deadline=deadline,
        request_deadline_s=llm.deadline.request_s,
        price=prices.lookup(model),
        client_factory=factory,
        sleep=watchdog.sleep,  # no retry once the run's driver is gone
    )


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


class LLMStage(Stage):
    """Base of stages that make one LLM call per row."""

    client: LLMClient
    cache: ResponseCache | None = None
    budget: Any = None  # the run's BudgetActor handle, when the recipe has caps
    slots: int = 1
    _slots: asyncio.Semaphore | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _cache_error: str | None = None  # set by the first failed cache write: no new call starts

    def attach(self, cfg: RecipeConfig) -> None:
        """Open this actor's view of the run's response cache and find its budget actor."""
        self.cache = open_cache(cfg)
        self.budget = find_budget(cfg)
        self.slots = per_actor_concurrency(cfg)

    def close(self) -> None:
        """Close the cache and the client's HTTP sessions (on the loop that opened them)."""
        if self.cache is not None:
            self.cache.close()
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.client.aclose(), loop).result(timeout=5)
        elif loop is None or loop.is_closed():
            asyncio.run(self.client.aclose())

    async def _spend(self, c: Completion) -> None:
        if self.budget is not None:
            usage = usage_record(c)
            tokens = usage["prompt_tokens"] + usage["completion_tokens"]
            await self.budget.finish.remote(c.cost_usd, tokens)

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

    async def call(
        self, row: dict[str, Any], messages: list[dict[str, str]], rid: str
    ) -> Completion | None:
        """Make the call (or replay it from the cache) and record it on ``row``.

        Returns None when the row failed (after retries) or a budget cap stopped the
        call before it started (status ``unissued``).
        """
        self._loop = asyncio.get_running_loop()
        watchdog.note_loop(self._loop)
        row["request_id"] = rid
        record = self.cache.get(rid) if self.cache is not None else None
        if record is not None:
            c = completion_from_record(record)
            row["cached"] = True
        else:
            # Take a concurrency slot first, then ask the budget: a call is counted
            # against the caps only when it really starts, so at most the calls in
            # flight can overshoot a cap.
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.slots)
            async with self._slots:
                watchdog.check()  # the driver is gone: no new request
                if self._cache_error is not None:  # an answer now could not be stored
                    row.update(
                        status=UNISSUED,
                        stage=self.name,
                        reason="cache_write",
                        message=f"not sent: the cache refused a write ({self._cache_error})",
                    )
                    return None
                if self.budget is not None and not await self.budget.try_start.remote():
                    row.update(
                        status=UNISSUED,
                        stage=self.name,
                        reason="budget",
                        message="a budget cap was reached before this call started",
                    )
                    return None
                try:
                    c = await self.client.complete(messages, request_id=rid)
                    # A model may echo a secret it was shown; it never reaches a file.
                    c = dataclasses.replace(
                        c,
                        text=redact(c.text),
                        reasoning=redact(c.reasoning) if c.reasoning else None,
                    )
                except LLMError as exc:
                    row["attempts"] = getattr(exc, "attempts", None)
                    add_retries(row, getattr(exc, "retries", None))
                    if isinstance(exc, LLMUnavailable):  # never sent: not a failed row
                        row.update(
                            status=UNISSUED,
                            stage=self.name,
                            reason=exc.reason,
                            message=exc.describe(),
                        )
                        return None
                    fail(row, self.name, exc.reason, exc.describe())
                    return None
                if self.cache is not None:  # persisted before anything else can go wrong
                    self._store(row, rid, c)
                await self._spend(c)  # inside the slot: the next call sees this cost
            row["cached"] = False
        if row["cached"]:
            await self._spend(c)  # paid by an earlier run; counts towards the caps
        row["cached_responses"] = (row.get("cached_responses") or 0) + int(row["cached"])
        row["paid_usd"] = (row.get("paid_usd") or 0.0) + (0.0 if row["cached"] else c.cost_usd)
        row.update(
            completion=c.text,
            usage=json.dumps(usage_record(c)),
            cost_usd=c.cost_usd,
            attempts=c.attempts,
            latency_s=c.latency_s,
            endpoint=c.endpoint,
            fingerprint=c.system_fingerprint,
        )
        if row["cached"] is False:
            add_retries(row, c.retries)
        return c
