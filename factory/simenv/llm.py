"""The LLM behind the simulated roles: the recipe's backend, the response cache and a budget.

Why the engine's pieces and not a client of its own: an RL run pays for the same
model calls a data run does, so it obeys the same rules (GUIDE "Money is real"):
a request's id is content-derived (``factory.engine.stages.llm_stage.request_id``,
plus the episode seed, so two episodes of one task may differ yet a replay does
not); a cached answer is returned without a call; a new answer is stored in the
``ResponseCache`` before it is parsed, then counted in the budget. The budget is a
``BudgetState`` in process or the engine's named ``BudgetActor`` shared by every
environment server of a Ray job (anything with ``try_start``/``finish``, awaited
through ``.remote`` when it is an actor handle).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.engine.budget import BudgetState
from factory.engine.stages.llm_stage import request_id
from factory.errors import BudgetExceeded, LLMError
from factory.io.cache import ResponseCache, completion_from_record, completion_to_record
from factory.llm.backends import Backend, LLMRequest

__all__ = ["LLMStats", "RoleLLM"]


@dataclass
class LLMStats:
    """Counts of one ``RoleLLM`` (cache hits are not calls)."""

    calls: int = 0
    cache_hits: int = 0
    failed: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    by_role: dict[str, int] = field(default_factory=dict)


async def _ask(budget: Any, method: str, *args: Any) -> Any:
    fn = getattr(budget, method)
    remote = getattr(fn, "remote", None)
    result = remote(*args) if remote is not None else fn(*args)
    return await result if inspect.isawaitable(result) else result


class RoleLLM:
    """Answers role prompts through a backend, the cache first.

    Args:
        backend: a built backend (``factory.llm.backends.build_backend``); None for a
            replay from the cache alone (a miss is then an ``LLMError``).
        model: the model id (part of every request id).
        sampling: the sampling parameters (part of every request id).
        cache: where answers are stored; None keeps nothing (no replay, no saving).
        budget: a ``BudgetState`` (default: no caps) or a ``BudgetActor`` handle.
        concurrency: requests in flight at once from this process.
    """

    def __init__(
        self,
        backend: Backend | None,
        *,
        model: str,
        sampling: Mapping[str, Any] | None = None,
        cache: ResponseCache | None = None,
        budget: Any = None,
        concurrency: int = 256,
    ):
        self.backend = backend
        self.model = model
        self.sampling = dict(sampling or {})
        self.cache = cache
        self.budget = budget if budget is not None else BudgetState()
        self.stats = LLMStats()
        self._slots = asyncio.Semaphore(concurrency)

    async def complete(self, role: str, messages: list[dict[str, Any]], **identity: Any) -> str:
        """The answer text of one role prompt.

        Raises:
            LLMError: the backend failed after its retries, or a replay missed the cache.
            BudgetExceeded: a cap was reached before a new call could start.
        """
        rid = request_id(f"simenv_{role}", self.model, self.sampling, messages, **identity)
        self.stats.by_role[role] = self.stats.by_role.get(role, 0) + 1
        if self.cache is not None:
            record = self.cache.get(rid)
            if record is not None:
                cached = completion_from_record(record)
                self.stats.cache_hits += 1
                # paid by an earlier run: never refused, but counted against the caps
                tokens = cached.usage.total
                await _ask(self.budget, "finish", cached.cost_usd, tokens)
                return cached.text
        if self.backend is None:
            raise LLMError(f"no LLM to ask and {rid} is not in the cache (replay-only mode)")
        if not await _ask(self.budget, "try_start"):
            raise BudgetExceeded("budget", f"the simulated environment's budget is spent ({rid})")
        async with self._slots:
            results = [r async for r in self.backend.run([LLMRequest.of(rid, messages)])]
        result = results[0]
        if result.error is not None:
            self.stats.failed += 1
            raise result.error
        completion = result.completion
        assert completion is not None
        if self.cache is not None:  # stored before anything else can fail
            self.cache.put(rid, completion_to_record(completion))
        tokens = completion.usage.total
        self.stats.calls += 1
        self.stats.tokens += tokens
        self.stats.cost_usd += completion.cost_usd
        await _ask(self.budget, "finish", completion.cost_usd, tokens)
        return completion.text

    async def aclose(self) -> None:
        if self.backend is not None:
            await self.backend.aclose()
        if self.cache is not None:
            self.cache.flush()
