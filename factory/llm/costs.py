"""What a run costs with a provider's prompt cache and batch API, before and after.

Why a module of its own: the per-completion price (``factory.llm.pricing.cost``) says
what one answer cost; a person deciding on a 90,000-row run needs what the whole run
will cost with the provider's caching and batch discount (issue 35, point 4), and after
the run what caching and batching saved and what 1,000 accepted rows cost. Both are
arithmetic over the price table and a backend's ``CacheTerms``; no I/O, no recipe.

Before (``estimate``): every call of a stage sends the stage's static prefix (policy,
tools, instructions: most of an amplification prompt) and a dynamic rest. A provider
caches the prefix when it is at least ``CacheTerms.min_tokens`` long; the first call of
each cache writes it (Anthropic bills the write at 1.25x; OpenAI and Gemini's implicit
cache bill it at the input price), later calls read it at the cached rate. Assumed: one
write per actor per ``ttl_s`` window of the run's estimated time (an actor's calls keep
its prefix warm; a cache that expired is written again), which over-counts writes for a
provider that refreshes the TTL on each hit, so the estimate errs on the high side. An
explicit context cache (Gemini's ``cachedContents``) is created once per actor and kept
for the whole run: its storage is billed per token-hour (``Price.cache_storage_per_mtok_hour``).

After (``stage_account``, ``per_thousand``): the cache-read share is cached input tokens
over input tokens; caching saved what the same tokens would have cost with every input
token at the full input rate, less what they cost; batching saved the online price of
the same tokens less the batch price. A stage with no price has a share and no dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from factory.llm.backends.base import CacheTerms
from factory.llm.pricing import Price, cost, explicit_cache_pays
from factory.llm.types import Usage

__all__ = [
    "CALL_OVERHEAD_S",
    "DECODE_TOKENS_PER_S",
    "CacheEstimate",
    "StageAccount",
    "Workload",
    "cache_read_share",
    "estimate",
    "per_thousand",
    "run_seconds",
    "stage_account",
]

_MTOK = 1_000_000

# How long a call is assumed to take, for the run's estimated wall time (cache windows,
# storage hours): a second of overhead plus its output at a frontier model's decode rate.
CALL_OVERHEAD_S = 1.0
DECODE_TOKENS_PER_S = 50.0


def run_seconds(calls: int, concurrency: int, output_tokens: float) -> float:
    """Estimated wall time of ``calls`` made ``concurrency`` at a time, each writing
    ``output_tokens`` (``CALL_OVERHEAD_S`` + output / ``DECODE_TOKENS_PER_S`` per call)."""
    if calls <= 0:
        return 0.0
    per_call = CALL_OVERHEAD_S + max(output_tokens, 0.0) / DECODE_TOKENS_PER_S
    return math.ceil(calls / max(concurrency, 1)) * per_call


@dataclass(frozen=True)
class Workload:
    """One stage's planned calls, per call (``static_tokens``: the static prefix every
    call repeats; ``dynamic_tokens``: the rest of its prompt), by ``writers`` actors
    (each keeps its own cache warm) over ``run_s`` estimated seconds."""

    calls: int
    static_tokens: int
    dynamic_tokens: float
    output_tokens: float
    writers: int = 1
    run_s: float = 0.0


@dataclass(frozen=True)
class CacheEstimate:
    """A stage's expected tokens and cost with the provider's cache (see the module
    docstring); dollars are None without a price.

    Attributes:
        usage: the tokens, cache reads and writes as assumed.
        writes: calls assumed to write the prefix to the cache.
        uncached_usd: the same calls at the same price with nothing cached.
        cached_usd: with the cache: reads, writes and storage.
        storage_usd: an explicit cache's storage (0 without one).
        assumption: one line saying what was assumed, for the plan.
    """

    usage: Usage
    writes: int
    uncached_usd: float | None
    cached_usd: float | None
    storage_usd: float | None
    assumption: str

    @property
    def saving_usd(self) -> float | None:
        if self.uncached_usd is None or self.cached_usd is None:
            return None
        return self.uncached_usd - self.cached_usd


def _hours(seconds: float) -> str:
    if seconds >= 360:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 60:,.0f} min" if seconds >= 60 else f"{seconds:,.0f} s"


def estimate(
    work: Workload,
    price: Price | None,
    terms: CacheTerms | None,
    *,
    explicit: bool | Literal["auto"] = False,
) -> CacheEstimate:
    """A stage's expected cost with and without the provider's prompt cache.

    Args:
        work: the stage's calls and tokens per call.
        price: the model's price as the run pays it (a batch API's when the backend is
            batched); None: unpriced (tokens only).
        terms: how the provider caches a prefix (``BackendPlugin.cache``); None: no
            cache the run pays less for.
        explicit: the backend holds the prefix in an explicit context cache (only where
            ``terms.explicit_cache`` and the backend's option turns it on); ``"auto"``:
            where ``pricing.explicit_cache_pays`` says it pays for this stage's calls per
            cache lifetime, as the backend decides at run time.
    """
    calls, static = max(work.calls, 0), max(work.static_tokens, 0)
    prompt = round(calls * (static + max(work.dynamic_tokens, 0.0)))
    output = round(calls * max(work.output_tokens, 0.0))
    plain = Usage(input=prompt, output=output)
    uncached = None if price is None else cost(plain, price)
    if terms is None or calls == 0:
        why = "no provider prompt cache assumed (the backend states none)"
        return CacheEstimate(plain, 0, uncached, uncached, None if price is None else 0.0, why)
    if static < terms.min_tokens:
        why = (
            f"no prompt caching: the static prefix ({static:,} tokens) is shorter than the "
            f"provider's minimum of {terms.min_tokens:,}"
        )
        return CacheEstimate(plain, 0, uncached, uncached, None if price is None else 0.0, why)
    writers = max(work.writers, 1)
    if explicit == "auto" and terms.explicit_cache:
        windows = max(work.run_s / terms.ttl_s, 1.0) if terms.ttl_s > 0 else 1.0
        explicit = explicit_cache_pays(
            static,
            calls / writers / windows,  # one actor's calls in one cache lifetime
            price,
            terms.ttl_s,
            None if price is None else price.cache_storage_per_mtok_hour,
            min_tokens=terms.min_tokens,
        )
    explicit = explicit is True and terms.explicit_cache
    if explicit:  # one explicit cache per actor, kept for the whole run
        writes = min(calls, writers)
        hours = work.run_s / 3600
        rate = None if price is None else price.cache_storage_per_mtok_hour
        storage = None if price is None else static * writes * hours * (rate or 0.0) / _MTOK
        why = (
            f"an explicit context cache of the {static:,}-token prefix per actor ({writers}), "
            f"kept ~{_hours(work.run_s)} (the run's estimated time), storage billed per "
            "token-hour"
        )
    else:
        windows = max(1, math.ceil(work.run_s / terms.ttl_s)) if terms.ttl_s > 0 else 1
        writes = min(calls, writers * windows)
        storage = 0.0 if price is not None else None
        how = "marked for caching" if terms.marked else "cached automatically"
        why = (
            f"the {static:,}-token static prefix {how}; one cache write per actor ({writers}) "
            f"per {terms.ttl_s / 60:g}-minute window over ~{_hours(work.run_s)}: "
            f"{writes:,} write{'s' if writes != 1 else ''}, the other calls read it"
        )
    written = writes * static if (terms.marked or explicit) else 0  # billed as writes
    usage = Usage(
        input=prompt, cached_input=(calls - writes) * static, cache_write=written, output=output
    )
    cached = None if price is None else cost(usage, price) + (storage or 0.0)
    return CacheEstimate(usage, writes, uncached, cached, storage, why)


def cache_read_share(usage: Usage | None) -> float | None:
    """Cached input tokens over input tokens (None: no input counted). The one
    calculation of a stage's, and a run's, cache-read share."""
    if usage is None or usage.input <= 0:
        return None
    return usage.cached_input / usage.input


@dataclass(frozen=True)
class StageAccount:
    """What a stage's tokens cost and what its cache and batch API saved (dollars None
    without a price; ``batch_saved_usd`` None when the stage did not run batched)."""

    read_share: float | None
    cache_write_tokens: int
    cost_usd: float | None
    full_input_usd: float | None
    cache_saved_usd: float | None
    batch_saved_usd: float | None


def stage_account(usage: Usage | None, price: Price | None, online: Price | None) -> StageAccount:
    """Account for a stage's ``usage``.

    Args:
        usage: every answer's tokens together (cache replays included: the output's
            cost, as ``cost_usd`` counts it).
        price: what the stage paid per token (the batch price when batched); None:
            unpriced.
        online: the online price when the stage ran through a batch API, else None.
    """
    used = usage or Usage()
    share = cache_read_share(usage)
    if price is None:
        return StageAccount(share, used.cache_write, None, None, None, None)
    paid = cost(used, price)
    full = cost(Usage(input=used.input, output=used.output), price)
    batch = None if online is None else cost(used, online) - paid
    return StageAccount(share, used.cache_write, paid, full, full - paid, batch)


def per_thousand(cost_usd: float | None, accepted: int) -> float | None:
    """USD per 1,000 accepted rows (None: no price, or no accepted row)."""
    if cost_usd is None or accepted <= 0:
        return None
    return cost_usd * 1000 / accepted
