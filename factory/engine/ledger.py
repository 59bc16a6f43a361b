"""One ledger per run: what every stage spent, what it decided, what it left unissued.

Why one object on the driver: tokens, cost, the budget caps, unissued and failed
calls and the run's time series were kept by three job functions each in their own
way (``judge_tokens``, ``amplify_tokens``, a hand-built ``by_stage``) and by a
budget actor every LLM request had to ask. Now every result a worker sends back is
counted here the moment it arrives (``arrived``: spend, calls, retries per LLM
stage, so a cap stops new work at once), every row's fate when the driver uses it
(``decided``: accepted, surplus, rejected, failed per deciding stage), and the
manifest's accounting sections come from ``manifest_fields``: per stage its tokens, cost
and, from the stage's price (``prices``), its cache-read share and what its provider's
prompt cache and batch API saved (``factory.llm.costs.stage_account``). Pure: no Ray, no
I/O.

Caps (``max_cost_usd``, ``max_tokens``, ``max_calls``) count every stage, cached
replays included (a cap bounds the total spend behind one output folder, across
resumes). ``admit`` says how many more LLM items may go out now: ``max_calls`` is
exact (items in flight count as calls until they come back), money and tokens may
be overshot by what the requests in flight cost, as with any provider. A batched
backend reserves an estimate per item until its answer settles it, since a batch
API answers hours later.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from factory.engine.rows import Fate, Row, Status
from factory.engine.work import ItemResult
from factory.llm.backends.openai_wire import tokens_record, tokens_usage
from factory.llm.costs import StageAccount, stage_account
from factory.llm.pricing import Price
from factory.llm.types import Usage

__all__ = ["CAPS", "TIMELINE_COLUMNS", "Caps", "Ledger", "StageSpend", "cap_reached"]

CAPS = ("max_calls", "max_cost_usd", "max_tokens")
# The run's time series (manifest ``timeline``, plotted by the run report): one point per
# TIMELINE_EVERY_S at most, halved in resolution whenever it passes TIMELINE_MAX points,
# so a day-long run keeps a few kB.
TIMELINE_COLUMNS = (
    "seconds",
    "total",
    "accepted",
    "cost_usd",
    "paid_usd",
    "responses_from_cache",
    "results",
)
TIMELINE_EVERY_S = 0.2
TIMELINE_MAX = 400


@dataclass(frozen=True)
class Caps:
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    max_calls: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.max_cost_usd, self.max_tokens, self.max_calls))

    def left(self, cost_usd: float, tokens: int, calls: int) -> Caps:
        """What is left of each cap after that spend (None: no cap); at least a sliver, so
        a run given the rest (a mixed recipe's next part) stops at once with the cap's
        name instead of failing the recipe's validation."""

        def rest(cap: float | None, used: float) -> float | None:
            return None if cap is None else max(cap - used, 1e-9)

        def rest_int(cap: int | None, used: int) -> int | None:
            return None if cap is None else max(1, int(cap - used))

        return Caps(
            rest(self.max_cost_usd, cost_usd),
            rest_int(self.max_tokens, tokens),
            rest_int(self.max_calls, calls),
        )


def cap_reached(
    caps: Caps, cost_usd: float, tokens: int, calls: int, adding: tuple[float, int] = (0.0, 0)
) -> str | None:
    """The first cap reached by that spend (reservations included), or None; with
    ``adding`` (a batched request's estimated cost and tokens): the first cap it would
    cross. The one cap calculation: the run's ``Ledger`` and the simulated environments'
    ``BudgetState`` (``factory.engine.budget``) both ask it (pure)."""
    add_cost, add_tokens = adding
    if caps.max_cost_usd is not None and (
        cost_usd >= caps.max_cost_usd or (add_cost > 0 and cost_usd + add_cost > caps.max_cost_usd)
    ):
        return "max_cost_usd"
    if caps.max_tokens is not None and (
        tokens >= caps.max_tokens or (add_tokens > 0 and tokens + add_tokens > caps.max_tokens)
    ):
        return "max_tokens"
    if caps.max_calls is not None and calls >= caps.max_calls:
        return "max_calls"
    return None


@dataclass
class StageSpend:
    """What one LLM stage spent: tokens, cost (whoever paid), what this run paid."""

    usage: Usage | None = None  # None: no answer counted yet (the manifest's tokens: {})
    cost_usd: float = 0.0
    paid_usd: float = 0.0
    calls: int = 0  # requests sent by this run (cache replays are not calls)
    replayed: int = 0  # responses answered from the cache
    retries: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    unissued: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": {} if self.usage is None else tokens_record(self.usage),
            "cost_usd": round(self.cost_usd, 6),
            "cost_usd_paid_this_run": round(self.paid_usd, 6),
            "calls": self.calls,
            "responses_from_cache": self.replayed,
            "retries": dict(sorted(self.retries.items())),
            Fate.FAILED: self.failed,
            Fate.UNISSUED: self.unissued,
        }


class Ledger:
    """The run's accounts (see the module docstring)."""

    def __init__(
        self,
        caps: Caps | None = None,
        *,
        started: float | None = None,
        prices: dict[str, tuple[Price | None, Price | None]] | None = None,
    ) -> None:
        self.caps = caps or Caps()
        # stage -> (the price it pays, the online price when it runs batched), as
        # ``settings.stage_prices`` gives them: what its savings are counted with
        self.prices = dict(prices or {})
        self.started = time.time() if started is None else started
        self.spend: dict[str, StageSpend] = defaultdict(StageSpend)
        self.decisions: dict[str, Counter[str]] = defaultdict(Counter)  # stage -> kind counts
        self.reasons: dict[str, Counter[str]] = defaultdict(Counter)  # stage -> reason codes
        self.kinds: Counter[Fate] = Counter()  # accepted / surplus / rejected / failed totals
        self.results = 0  # items whose results arrived (any order): what progress counts
        self.rows_arrived = 0
        self.stopped_by: str | None = None
        self.reserved_usd = 0.0
        self.reserved_tokens = 0
        self.last_success: float | None = None  # a completed LLM answer (wall clock)
        # What one LLM item costs lately (moving average): items in flight are counted at
        # it against the caps, so a cap is overshot by the variance of what is in flight,
        # not by everything the workers hold.
        self.item_cost: float | None = None
        self.item_tokens: float | None = None
        self.timeline: list[list[float]] = []
        self._timeline_every = TIMELINE_EVERY_S
        self._timeline_last = 0.0

    # -- totals ---------------------------------------------------------------------------
    @property
    def cost_usd(self) -> float:
        return sum(s.cost_usd for s in self.spend.values())

    @property
    def paid_usd(self) -> float:
        return sum(s.paid_usd for s in self.spend.values())

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.spend.values())

    @property
    def replayed(self) -> int:
        return sum(s.replayed for s in self.spend.values())

    @property
    def usage(self) -> Usage | None:
        """What every stage's answers used (None: no answer counted yet)."""
        used = [s.usage for s in self.spend.values() if s.usage is not None]
        return sum(used[1:], used[0]) if used else None

    @property
    def run_tokens(self) -> int:
        """Input + output tokens (cached tokens are part of the input's)."""
        used = self.usage
        return 0 if used is None else used.total

    @property
    def unissued(self) -> int:
        return sum(s.unissued for s in self.spend.values())

    @property
    def accepted(self) -> int:
        return self.kinds[Fate.ACCEPTED]

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    # -- arrivals (any order) -------------------------------------------------------------
    def arrived(self, result: ItemResult, *, reserved: tuple[float, int] = (0.0, 0)) -> None:
        """Count what one item's rows spent (they may still be rejected later). Each
        row's ``usage`` is parsed once here (the item average reads the parsed value)."""
        self.results += 1
        self.release(*reserved)
        priced: list[tuple[float, Usage]] = []  # (cost, usage) of the LLM rows
        for row in result.rows:
            self.rows_arrived += 1
            stage = row.get("llm_stage")
            if not stage:
                continue
            spend = self.spend[stage]
            if row.get("usage"):
                used = tokens_usage(json.loads(row["usage"] or "{}"))
                priced.append((float(row.get("cost_usd") or 0.0), used))
                spend.usage = used if spend.usage is None else spend.usage + used
            spend.cost_usd += float(row.get("cost_usd") or 0.0)
            spend.paid_usd += float(row.get("paid_usd") or 0.0)
            spend.replayed += int(row.get("cached_responses") or 0)
            spend.calls += int(row.get("calls") or 0)
            if row.get("retries"):
                spend.retries.update(json.loads(row["retries"] or "{}"))
            status = row.get("status")
            if status == Status.UNISSUED:
                spend.unissued += 1
            elif status == Status.FAILED and row.get("stage") == stage:
                spend.failed += 1
            if row.get("completion") or row.get("output") or row.get("verdict"):
                self.last_success = time.time()
        self._item_average(priced)
        self.sample()

    def _item_average(self, priced: list[tuple[float, Usage]], weight: float = 0.1) -> None:
        """Move the average cost and tokens of an item towards this one's (its LLM rows'
        ``(cost, parsed usage)``)."""
        if not priced:
            return
        cost = sum(c for c, _ in priced)
        tokens = 0
        for _, used in priced:
            tokens += used.total
        if self.item_cost is None or self.item_tokens is None:
            self.item_cost, self.item_tokens = cost, float(tokens)
        else:
            self.item_cost += weight * (cost - self.item_cost)
            self.item_tokens += weight * (tokens - self.item_tokens)

    # -- decisions (in order) -------------------------------------------------------------
    def decided(self, row: Row, kind: Fate) -> None:
        """Count one row's fate: ``kind`` accepted / surplus / rejected / failed, by the
        stage that decided it (``row["stage"]``), with its reason when not accepted."""
        stage = row.get("stage") or "?"
        self.decisions[stage][kind] += 1
        self.kinds[kind] += 1
        if kind in (Fate.REJECTED, Fate.FAILED):
            self.reasons[stage][row.get("reason") or "unknown"] += 1

    # -- the budget -----------------------------------------------------------------------
    def exhausted(self) -> str | None:
        """The first cap reached (spend and reservations count), or None."""
        return cap_reached(
            self.caps,
            self.cost_usd + self.reserved_usd,
            self.run_tokens + self.reserved_tokens,
            self.calls,
        )

    def left(self) -> Caps:
        """What is left of the caps after this ledger's spend (``Caps.left``)."""
        return self.caps.left(self.cost_usd, self.run_tokens, self.calls)

    def carry(self, name: str, usage: Usage | None, cost_usd: float, calls: int) -> None:
        """Count the spend of a run made apart (a mixed recipe's part, read from its
        manifest) under ``name``: its tokens, its cost and its calls count against the
        caps like this run's own."""
        spend = self.spend[name]
        if usage is not None:
            spend.usage = usage if spend.usage is None else spend.usage + usage
        spend.cost_usd += cost_usd
        spend.calls += calls

    def allowance(self, wanted: int, in_flight: int, estimate: tuple[float, int] = (0.0, 0)) -> int:
        """How many of ``wanted`` LLM items may go out now, with ``in_flight`` out already.

        ``estimate``: (cost, tokens) one item reserves (a batched backend), or zeros.
        Sets ``stopped_by`` when a cap leaves no room and nothing is in flight.
        """
        cap = self.exhausted()
        if cap is not None:
            self.stopped_by = self.stopped_by or cap
            return 0
        n = wanted
        if self.caps.max_calls is not None:
            n = min(n, self.caps.max_calls - self.calls - in_flight)
        reserved_each = estimate != (0.0, 0)  # a batched backend reserves per item
        cost = max(estimate[0], self.item_cost or 0.0)
        tokens = max(float(estimate[1]), self.item_tokens or 0.0)
        unreserved = 0 if reserved_each else in_flight  # in flight, counted at the average
        if cost > 0 and self.caps.max_cost_usd is not None:
            left = self.caps.max_cost_usd - self.cost_usd - self.reserved_usd - unreserved * cost
            n = min(n, int(left // cost))
        if tokens > 0 and self.caps.max_tokens is not None:
            left_t = self.caps.max_tokens - self.run_tokens - self.reserved_tokens
            n = min(n, int((left_t - unreserved * tokens) // tokens))
        n = max(0, n)
        if n == 0 and in_flight == 0 and wanted > 0 and not reserved_each:
            n = 1 if self.caps.max_calls is None or self.calls < self.caps.max_calls else 0
        if n == 0 and in_flight == 0 and wanted > 0:
            self.stopped_by = self.stopped_by or self._binding_cap(estimate)
        return n

    def reserve(self, n: int, estimate: tuple[float, int]) -> None:
        """Reserve ``estimate`` for each of ``n`` LLM items sent out."""
        self.reserved_usd += n * estimate[0]
        self.reserved_tokens += n * estimate[1]

    def _binding_cap(self, estimate: tuple[float, int]) -> str:
        if self.caps.max_calls is not None and self.calls >= self.caps.max_calls:
            return "max_calls"
        if estimate[0] > 0 and self.caps.max_cost_usd is not None:
            return "max_cost_usd"
        if estimate[1] > 0 and self.caps.max_tokens is not None:
            return "max_tokens"
        return "max_calls"

    def release(self, cost: float = 0.0, tokens: int = 0) -> None:
        """Give back an item's reservation (its spend is counted from its rows)."""
        self.reserved_usd = max(0.0, self.reserved_usd - cost)
        self.reserved_tokens = max(0, self.reserved_tokens - tokens)

    def budget(self) -> dict[str, Any] | None:
        """The manifest's ``budget`` section: the caps and what counted against them."""
        if not self.caps.any():
            return None
        return {
            "max_cost_usd": self.caps.max_cost_usd,
            "max_tokens": self.caps.max_tokens,
            "max_calls": self.caps.max_calls,
            "cost_usd": round(self.cost_usd, 6),
            "tokens": self.run_tokens,
            "calls": self.calls,
            "stopped_by": self.stopped_by,
        }

    # -- time series ----------------------------------------------------------------------
    def sample(self, *, force: bool = False) -> None:
        """Add a point to the time series (throughput and cost over time)."""
        now = time.time()
        if not force and now - self._timeline_last < self._timeline_every:
            return
        self._timeline_last = now
        point: list[float] = [round(now - self.started, 3), self.total, self.accepted]
        point += [round(self.cost_usd, 6), round(self.paid_usd, 6), self.replayed, self.results]
        self.timeline.append(point)
        if len(self.timeline) > TIMELINE_MAX:
            self.timeline = self.timeline[1::2]
            self._timeline_every *= 2

    # -- the manifest ---------------------------------------------------------------------
    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's accounting sections (counts by stage and reason are the
        manifest's own ``stages`` / ``reasons``: see ``stages``)."""
        self.sample(force=True)
        retries: Counter[str] = Counter()
        for s in self.spend.values():
            retries.update(s.retries)
        return {
            "tokens": {} if (used := self.usage) is None else tokens_record(used),
            "cost_usd": round(self.cost_usd, 6),
            "cost_usd_paid_this_run": round(self.paid_usd, 6),
            "responses_from_cache": self.replayed,
            Fate.UNISSUED: self.unissued,
            "unissued_by_stage": {k: s.unissued for k, s in sorted(self.spend.items())},
            "by_stage": {k: self._stage_fields(k) for k in sorted(self.spend)},
            "retries": dict(sorted(retries.items())),
            "budget": self.budget(),
            "timeline": {"columns": list(TIMELINE_COLUMNS), "points": self.timeline},
        }

    def account(self, stage: str) -> StageAccount:
        """What ``stage``'s answers cost and what caching and batching saved (no dollars
        for a stage the ledger has no price of)."""
        paid, online = self.prices.get(stage, (None, None))
        spent = self.spend.get(stage)
        return stage_account(None if spent is None else spent.usage, paid, online)

    def savings(self) -> dict[str, float | None]:
        """What caching and batching saved over every priced stage (None: no stage is
        priced; ``batch_saved_usd`` None: no stage ran batched)."""
        accounts = [self.account(s) for s in self.spend]
        cache = [a.cache_saved_usd for a in accounts if a.cache_saved_usd is not None]
        batch = [a.batch_saved_usd for a in accounts if a.batch_saved_usd is not None]
        return {
            "cache_saved_usd": round(sum(cache), 6) if cache else None,
            "batch_saved_usd": round(sum(batch), 6) if batch else None,
        }

    def _stage_fields(self, stage: str) -> dict[str, Any]:
        """A stage's ``by_stage`` entry: its spend, its cache-read share, and (priced)
        what caching saved, and batching when it ran batched."""
        out = self.spend[stage].as_dict()
        account = self.account(stage)
        share = account.read_share
        out["cache_read_share"] = None if share is None else round(share, 4)
        if account.cache_saved_usd is not None:
            out["cache_saved_usd"] = round(account.cache_saved_usd, 6)
        if account.batch_saved_usd is not None:
            out["batch_saved_usd"] = round(account.batch_saved_usd, 6)
        return out

    def stages(self) -> dict[str, dict[str, int]]:
        return {s: dict(c) for s, c in self.decisions.items()}

    def totals(self) -> dict[str, int]:
        return {
            "total": self.total,
            Fate.ACCEPTED: self.kinds[Fate.ACCEPTED],
            Fate.SURPLUS: self.kinds[Fate.SURPLUS],
            Fate.REJECTED: self.kinds[Fate.REJECTED],
            Fate.FAILED: self.kinds[Fate.FAILED],
        }
