"""The cost of a run with a provider's prompt cache and batch API, before (the plan's
estimate) and after (cache-read share, what caching and batching saved, the cost per
1,000 accepted rows): ``factory.llm.costs``."""

from __future__ import annotations

import pytest

from factory.llm.backends.base import OPENAI_CACHE, CacheTerms
from factory.llm.costs import (
    Workload,
    cache_read_share,
    estimate,
    per_thousand,
    run_seconds,
    stage_account,
)
from factory.llm.pricing import PriceTable
from factory.llm.types import Usage

TABLE = PriceTable()
# 1,000 calls of a 6,000-token prefix and 1,000 tokens of their own, 800 tokens out, by 2
# actors over 20 minutes: the shape of a small amplification run.
WORK = Workload(
    calls=1000, static_tokens=6000, dynamic_tokens=1000, output_tokens=800, writers=2, run_s=1200
)
ANTHROPIC = CacheTerms(min_tokens=1024, ttl_s=300.0, marked=True)
GEMINI = CacheTerms(min_tokens=1024, ttl_s=3600.0, explicit_cache=True)


def usd(tokens: float, per_mtok: float) -> float:
    return tokens * per_mtok / 1e6


def test_openai_caches_automatically_and_bills_no_write() -> None:
    price = TABLE.lookup("gpt-5")
    assert price is not None
    est = estimate(WORK, price, OPENAI_CACHE)
    assert est.writes == 2 * 4  # 2 actors x ceil(1200 s / 300 s) windows
    assert est.usage.cached_input == (1000 - 8) * 6000 and est.usage.cache_write == 0
    input_tokens, output = 1000 * 7000, 1000 * 800
    assert est.uncached_usd == pytest.approx(usd(input_tokens, 1.25) + usd(output, 10.0))
    first_calls = usd(8 * 7000 + 992 * 1000, 1.25)  # written at the input price, no surcharge
    assert est.cached_usd == pytest.approx(first_calls + usd(992 * 6000, 0.125) + usd(output, 10))
    assert est.saving_usd == pytest.approx(usd(992 * 6000, 1.25 - 0.125))
    assert "cached automatically" in est.assumption and "8 writes" in est.assumption


def test_anthropic_marks_the_prefix_and_pays_its_writes_at_one_and_a_quarter() -> None:
    price = TABLE.lookup("claude-sonnet-4-5")
    assert price is not None
    est = estimate(WORK, price, ANTHROPIC)
    assert est.usage.cache_write == 8 * 6000 and est.usage.cached_input == 992 * 6000
    assert est.cached_usd == pytest.approx(
        usd(8 * 6000, 3.75) + usd(992 * 6000, 0.30) + usd(1000 * 1000, 3.0) + usd(800_000, 15.0)
    )
    assert "marked for caching" in est.assumption
    # a longer run writes more: one write per actor per 5-minute window
    longer = estimate(Workload(1000, 6000, 1000, 800, writers=2, run_s=3 * 3600), price, ANTHROPIC)
    assert longer.writes == 2 * 36 and longer.cached_usd > est.cached_usd  # type: ignore[operator]


def test_gemini_explicit_cache_counts_its_storage_per_token_hour() -> None:
    price = TABLE.lookup("gemini-2.5-flash")
    assert price is not None and price.cache_storage_per_mtok_hour == 1.0
    implicit = estimate(WORK, price, GEMINI)
    explicit = estimate(WORK, price, GEMINI, explicit=True)
    assert implicit.storage_usd == 0.0
    assert explicit.writes == 2  # one cache per actor, kept for the run
    storage = 6000 * 2 * (1200 / 3600) * 1.0 / 1e6
    assert explicit.storage_usd == pytest.approx(storage)
    tokens = usd(2 * 6000 + 1000 * 1000, 0.30) + usd(998 * 6000, 0.03) + usd(800_000, 2.5)
    assert explicit.cached_usd == pytest.approx(tokens + storage)
    assert "explicit context cache" in explicit.assumption
    # an explicit cache the backend cannot hold is not assumed
    assert estimate(WORK, price, OPENAI_CACHE, explicit=True).storage_usd == 0.0


def test_auto_holds_an_explicit_cache_only_where_the_backend_would_find_it_pays() -> None:
    """``explicit_cache: auto`` is planned as the Gemini backend decides at run time
    (``pricing.explicit_cache_pays`` on one actor's calls per cache lifetime): a busy stage
    gets the cache, a stage of a few calls or a model without a storage price does not."""
    price = TABLE.lookup("gemini-2.5-flash")
    assert price is not None
    busy = estimate(WORK, price, GEMINI, explicit="auto")
    assert busy.writes == 2 and busy.storage_usd and busy.storage_usd > 0  # explicit
    few = Workload(calls=2, static_tokens=6000, dynamic_tokens=1000, output_tokens=800,
                   writers=2, run_s=3 * 3600)  # fmt: skip
    assert estimate(few, price, GEMINI, explicit="auto").storage_usd == 0.0  # implicit
    unstored = TABLE.lookup("gpt-5")  # no storage price: never explicit
    assert estimate(WORK, unstored, GEMINI, explicit="auto").storage_usd == 0.0


@pytest.mark.parametrize("model", ["gpt-5", "claude-sonnet-4-5", "gemini-2.5-pro"])
def test_batch_halves_the_cached_estimate_and_stacks_with_caching(model: str) -> None:
    online, batch = TABLE.lookup(model), TABLE.lookup_batch(model)
    terms = ANTHROPIC if model.startswith("claude") else OPENAI_CACHE
    on, off = estimate(WORK, online, terms), estimate(WORK, batch, terms)
    assert off.cached_usd == pytest.approx(on.cached_usd / 2)  # type: ignore[operator]
    assert off.uncached_usd == pytest.approx(on.uncached_usd / 2)  # type: ignore[operator]
    assert off.cached_usd < on.cached_usd < on.uncached_usd  # type: ignore[operator]


def test_a_prefix_below_the_providers_minimum_is_not_cached() -> None:
    price = TABLE.lookup("claude-haiku-4-5")
    short = Workload(100, static_tokens=900, dynamic_tokens=300, output_tokens=50, writers=2)
    est = estimate(short, price, ANTHROPIC)
    assert est.usage.cached_input == 0 and est.usage.cache_write == 0 and est.writes == 0
    assert est.cached_usd == est.uncached_usd and est.saving_usd == 0
    assert "shorter than the provider's minimum of 1,024" in est.assumption
    none = estimate(WORK, price, None)  # a backend with no provider cache
    assert none.saving_usd == 0 and "no provider prompt cache" in none.assumption


def test_an_unpriced_model_is_estimated_in_tokens_only() -> None:
    est = estimate(WORK, None, ANTHROPIC)
    assert est.usage.cached_input > 0
    assert est.uncached_usd is est.cached_usd is est.storage_usd is est.saving_usd is None


def test_the_runs_time_is_its_calls_in_waves_of_the_concurrency() -> None:
    assert run_seconds(0, 8, 500) == 0.0
    assert run_seconds(100, 10, 100) == 10 * (1.0 + 2.0)
    assert run_seconds(101, 10, 100) == 11 * 3.0


def test_the_cache_read_share_and_what_caching_and_batching_saved() -> None:
    price = TABLE.lookup_batch("claude-sonnet-4-5")
    online = TABLE.lookup("claude-sonnet-4-5")
    used = Usage(input=10_000, cached_input=7_000, cache_write=2_000, output=500)
    account = stage_account(used, price, online)
    assert account.read_share == cache_read_share(used) == 0.7
    assert account.cache_write_tokens == 2_000
    paid = usd(1_000, 1.5) + usd(7_000, 0.15) + usd(2_000, 1.875) + usd(500, 7.5)
    assert account.cost_usd == pytest.approx(paid)
    assert account.full_input_usd == pytest.approx(usd(10_000, 1.5) + usd(500, 7.5))
    assert account.cache_saved_usd == pytest.approx(account.full_input_usd - paid)  # type: ignore[operator]
    assert account.batch_saved_usd == pytest.approx(paid)  # the batch price is half
    online_only = stage_account(used, online, None)
    assert online_only.batch_saved_usd is None
    # writes without reads cost more than no cache: the saving is negative, not hidden
    cold = stage_account(Usage(input=10_000, cache_write=9_000, output=0), online, None)
    assert cold.cache_saved_usd is not None and cold.cache_saved_usd < 0


def test_an_unpriced_stage_has_a_share_and_no_dollars() -> None:
    account = stage_account(Usage(input=100, cached_input=25, output=5), None, None)
    assert account.read_share == 0.25
    assert (account.cost_usd, account.cache_saved_usd, account.batch_saved_usd) == (None,) * 3
    assert cache_read_share(None) is None and cache_read_share(Usage()) is None


def test_the_cost_per_thousand_accepted_rows() -> None:
    assert per_thousand(2.5, 500) == pytest.approx(5.0)
    assert per_thousand(2.5, 0) is None and per_thousand(None, 500) is None
