"""Budget caps enforced across every actor: ``max_cost_usd``, ``max_tokens``, ``max_calls``.

Why an actor: the spend is known only when calls complete, on many actors at
once; sizing rounds on the driver alone would overshoot by up to a round. One
small named Ray actor holds the running totals; an LLM stage asks it before
each *new* call (``try_start``) and reports what the call cost (``finish``).
Once a cap is reached no new call starts, so the spend exceeds the cap by at
most what the calls already in flight cost.

A batch API answers hours after a request is submitted, so counting spend on the
answer would let every batch in flight overshoot. A batched request therefore
*reserves* its estimated cost and tokens when it is submitted (``try_start(cost,
tokens)``): reservations count against the caps like spend, a request whose
reservation would cross a cap is not submitted, and the answer settles it
(``finish(..., reserved=...)``: the reservation is released and the real spend
counted); a request that gets no answer releases it (``release``). With
``max_completion_tokens`` set the estimate is an upper bound on the output, so
the caps hold within the prompt-size estimate.

Cached responses were paid for by an earlier run: they are never refused (they
cost nothing now) but their recorded cost and tokens count towards the caps,
so a cap means the total spend behind one output folder, across resumes, and
raising it and resuming continues exactly where the capped run stopped.

A cost cap needs a price for every model it watches: an unpriced model costs 0,
so a cap over it would never trigger. ``check_cost_cap_priced`` refuses such a
recipe before anything starts.

``BudgetState`` is the pure logic (unit-tested without Ray); ``BudgetActor`` is
the thin Ray wrapper. Whether a cap is reached is the run ledger's own calculation
(``factory.engine.ledger.cap_reached``): a data run and a simulated environment stop at
the same point of the same spend.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from factory.engine.ledger import Caps, cap_reached
from factory.errors import ConfigError

if TYPE_CHECKING:
    from factory.recipe import Recipe

__all__ = ["BudgetActor", "BudgetState", "budget_actor", "check_cost_cap_priced"]


def check_cost_cap_priced(cfg: Recipe) -> None:
    """Refuse a ``max_cost_usd`` cap when a model it must watch has no price (the input
    check of the kinds with caps: ``factory.engine.jobs.registry``).

    Raises:
        ConfigError: naming the model, where it is used and how to price it
            (``prices:`` in the recipe, USD per million tokens).
    """
    from factory.engine.settings import llm_stages
    from factory.llm.pricing import PriceTable

    max_cost_usd = cfg.spend_caps()[0]  # None for a job that pays for no call
    if max_cost_usd is None:
        return
    keys = {"amplify": "llm.model", "prefilter": "prefilter.model"}
    used = [(keys[name], s.model) for name, s in llm_stages(cfg).items()]
    table = PriceTable.from_config(cfg.prices)
    for key, model in used:
        if model not in table:
            raise ConfigError(
                f"amplify.max_cost_usd is {max_cost_usd} but {key} {model!r} has no price "
                "(the built-in price table, factory/llm/pricing.py, does not list it), so "
                "its spend would count as 0 and the cap could never stop the run; give it a "
                f"price in the recipe, in USD per million tokens: prices: {{{model}: "
                "{input_per_mtok: ..., cached_input_per_mtok: ..., output_per_mtok: ...}}, or "
                "remove the cap "
                "(--set amplify.max_cost_usd=null)",
                key_path=f"prices.{model}",
            )


@dataclass
class BudgetState:
    """Running totals against the caps (``None`` = no cap)."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    max_calls: int | None = None
    cost_usd: float = 0.0
    tokens: int = 0
    calls: int = 0  # new calls started (cached replays are not calls)
    refused: int = 0
    stopped_by: str | None = field(default=None)
    reserved_cost_usd: float = 0.0  # submitted batched requests not answered yet
    reserved_tokens: int = 0

    def exhausted(self, cost_usd: float = 0.0, tokens: int = 0) -> str | None:
        """The first cap reached, or None; with a reservation (``cost_usd``,
        ``tokens`` > 0): the first cap it would cross."""
        return cap_reached(
            Caps(self.max_cost_usd, self.max_tokens, self.max_calls),
            self.cost_usd + self.reserved_cost_usd,
            self.tokens + self.reserved_tokens,
            self.calls,
            adding=(cost_usd, tokens),
        )

    def try_start(self, cost_usd: float = 0.0, tokens: int = 0) -> bool:
        """May one more new call start? Counts it, and reserves ``cost_usd`` and
        ``tokens`` (a batched request's estimate), when yes."""
        cap = self.exhausted(cost_usd, tokens)
        if cap is not None:
            self.stopped_by = self.stopped_by or cap
            self.refused += 1
            return False
        self.calls += 1
        self.reserved_cost_usd += cost_usd
        self.reserved_tokens += tokens
        return True

    def release(self, cost_usd: float = 0.0, tokens: int = 0) -> None:
        """Give back a reservation whose request got no answer (it costs nothing)."""
        self.reserved_cost_usd = max(0.0, self.reserved_cost_usd - cost_usd)
        self.reserved_tokens = max(0, self.reserved_tokens - tokens)

    def finish(self, cost_usd: float, tokens: int, reserved: tuple[float, int] = (0.0, 0)) -> None:
        """Record a completed call's (or a cached replay's) cost and tokens, settling the
        reservation it was submitted with."""
        self.release(*reserved)
        self.cost_usd += float(cost_usd or 0.0)
        self.tokens += int(tokens or 0)

    def snapshot(self) -> dict[str, Any]:
        return dict(self.__dict__)


class BudgetActor:
    """Ray actor around ``BudgetState`` (async methods: no thread per call)."""

    def __init__(self, **caps: Any):
        self.state = BudgetState(**caps)

    async def try_start(self, cost_usd: float = 0.0, tokens: int = 0) -> bool:
        return self.state.try_start(cost_usd, tokens)

    async def release(self, cost_usd: float = 0.0, tokens: int = 0) -> None:
        self.state.release(cost_usd, tokens)

    async def finish(
        self, cost_usd: float, tokens: int, reserved: tuple[float, int] = (0.0, 0)
    ) -> None:
        self.state.finish(cost_usd, tokens, reserved)

    async def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()


def budget_actor(name: str, **caps: Any) -> Any:
    """Create (or replace) the named budget actor of one run on the driver's node."""
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name))
    remote = ray.remote(num_cpus=0)(BudgetActor)
    return remote.options(name=name).remote(**caps)
