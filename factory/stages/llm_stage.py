"""What every LLM stage shares: building the client from the recipe, request ids,
and recording a completion (or its failure) on the row."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from typing import Any

from factory.config import RecipeConfig
from factory.errors import LLMError
from factory.llm import (
    Completion,
    Endpoint,
    EndpointPool,
    LLMClient,
    PriceTable,
    RetryPolicy,
    openai_client_factory,
)
from factory.llm.http import aiohttp_client_factory
from factory.stages.base import Stage, fail
from factory.trajectory import canonical_json

__all__ = ["LLMStage", "build_client", "per_actor_concurrency", "request_id"]


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
        price=prices.lookup(model),
        client_factory=factory,
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


class LLMStage(Stage):
    """Base of stages that make one LLM call per row."""

    client: LLMClient
    _loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        """Close the client's HTTP sessions on the loop that opened them."""
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.client.aclose(), loop).result(timeout=5)
        elif loop is None or loop.is_closed():
            asyncio.run(self.client.aclose())

    async def call(
        self, row: dict[str, Any], messages: list[dict[str, str]], rid: str
    ) -> Completion | None:
        """Make the call and record it on ``row``; on failure mark the row failed, return None."""
        self._loop = asyncio.get_running_loop()
        row["request_id"] = rid
        try:
            c = await self.client.complete(messages, request_id=rid)
        except LLMError as exc:
            row["attempts"] = getattr(exc, "attempts", None)
            fail(row, self.name, exc.reason, exc.describe())
            return None
        row.update(
            completion=c.text,
            usage=json.dumps(usage_record(c)),
            cost_usd=c.cost_usd,
            attempts=c.attempts,
            latency_s=c.latency_s,
            endpoint=c.endpoint,
            fingerprint=c.system_fingerprint,
        )
        return c
