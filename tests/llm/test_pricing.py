from __future__ import annotations

from typing import Any

import pytest
from openai.types import CompletionUsage

from factory.errors import ConfigError
from factory.llm.backends.openai_wire import usage_from_openai
from factory.llm.pricing import (
    DEFAULT_PRICES,
    PRICES_AS_OF,
    Price,
    PriceTable,
    cost,
)
from factory.llm.types import Usage

PRICE = Price(input_per_mtok=2.0, cached_input_per_mtok=0.5, output_per_mtok=8.0)


def split(usage: Usage) -> tuple[int, int, int]:
    return usage.uncached_input, usage.cached_input, usage.output


def test_cached_prompt_tokens_are_billed_at_the_cached_rate() -> None:
    usage = {
        "prompt_tokens": 1_000_000,
        "completion_tokens": 100_000,
        "total_tokens": 1_100_000,
        "prompt_tokens_details": {"cached_tokens": 400_000},
    }
    # 600k fresh * $2 + 400k cached * $0.5 + 100k out * $8
    assert cost(usage_from_openai(usage), PRICE) == pytest.approx(1.2 + 0.2 + 0.8)


def test_reasoning_tokens_inside_completion_are_billed_once() -> None:
    # OpenAI: reasoning_tokens is a subset of completion_tokens.
    usage = usage_from_openai(
        {
            "prompt_tokens": 1000,
            "completion_tokens": 3000,
            "total_tokens": 4000,
            "completion_tokens_details": {"reasoning_tokens": 2500},
        }
    )
    assert split(usage) == (1000, 0, 3000) and usage.reasoning == 2500
    assert cost(usage, PRICE) == pytest.approx((1000 * 2 + 3000 * 8) / 1e6)


def test_reasoning_tokens_reported_beside_completion_are_billed_as_output() -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 500,
        "total_tokens": 3500,
        "completion_tokens_details": {"reasoning_tokens": 2000},
    }
    assert split(usage_from_openai(usage)) == (1000, 0, 2500)


def test_sdk_usage_object_maps_like_its_json() -> None:
    usage = CompletionUsage.model_validate(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 4},
        }
    )
    assert split(usage_from_openai(usage.model_dump())) == (6, 4, 5)


@pytest.mark.parametrize(
    "usage",
    [None, {}, {"prompt_tokens": None, "completion_tokens": None}, {"prompt_tokens_details": None}],
)
def test_missing_usage_costs_nothing(usage: Any) -> None:
    assert usage_from_openai(usage) == Usage()
    assert cost(usage_from_openai(usage), PRICE) == 0.0
    assert cost(None, PRICE) == 0.0


def test_cached_count_never_exceeds_prompt() -> None:
    usage = {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}}
    assert split(usage_from_openai(usage)) == (0, 10, 0)


def test_unpriced_model_costs_zero() -> None:
    table = PriceTable.from_config({})
    assert table.lookup("Qwen/Qwen3-8B") is None
    assert cost(Usage(input=10**6, output=10**6), None) == 0.0


def test_cache_writes_cost_the_input_price_unless_priced_apart() -> None:
    usage = Usage(input=1_000_000, cached_input=200_000, cache_write=300_000, output=0)
    # 500k fresh * $2 + 200k read * $0.5 + 300k written * $2 (no write price: the input's)
    assert cost(usage, PRICE) == pytest.approx(1.0 + 0.1 + 0.6)
    table = PriceTable.from_config(
        {"claude": {"input_per_mtok": 2.0, "cached_input_per_mtok": 0.2,
                    "cache_write_per_mtok": 2.5, "output_per_mtok": 8.0, "batch_share": 0.5}}
    )  # fmt: skip
    price = table.lookup("claude")
    assert price is not None and price.cache_write_per_mtok == 2.5
    assert cost(usage, price) == pytest.approx(1.0 + 0.04 + 0.75)
    batch = table.lookup_batch("claude")
    assert batch is not None and batch.cache_write_per_mtok == 1.25
    assert table.as_dict()["claude"]["cache_write_per_mtok"] == 2.5
    assert "cache_write_per_mtok" not in table.as_dict()["gpt-5"]  # the manifest as before


def test_usages_add_field_by_field() -> None:
    a = Usage(input=10, cached_input=4, cache_write=1, output=3, reasoning=2)
    assert a + a == Usage(20, 8, 2, 6, 4)
    assert (a + a).total == 26


def test_defaults_cover_the_documented_models_and_carry_a_date() -> None:
    assert set(DEFAULT_PRICES) >= {"gpt-5", "gpt-5-mini", "o4-mini", "gpt-4o", "gpt-4.1"}
    assert PRICES_AS_OF[:2] == "20"
    for price in DEFAULT_PRICES.values():
        assert price.cached_input_per_mtok <= price.input_per_mtok


def test_config_overrides_and_extends_defaults() -> None:
    table = PriceTable.from_config(
        {
            "gpt-4o": {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.1, "output_per_mtok": 3.0},
            "my-local": {"input_per_mtok": 0.2, "output_per_mtok": 0.4},
        }
    )
    assert table.lookup("gpt-4o") == Price(1.0, 0.1, 3.0)
    assert table.lookup("my-local") == Price(0.2, 0.2, 0.4)  # no cache discount by default
    assert table.lookup("gpt-5") == DEFAULT_PRICES["gpt-5"]
    assert "my-local" in table and "unknown" not in table
    assert table.as_dict()["my-local"]["output_per_mtok"] == 0.4


def test_pydantic_like_config_objects_are_accepted() -> None:
    class Spec:
        def model_dump(self) -> dict[str, Any]:
            return {"input_per_mtok": 1.0, "cached_input_per_mtok": None, "output_per_mtok": 2.0}

    assert PriceTable.from_config({"m": Spec()}).lookup("m") == Price(1.0, 1.0, 2.0)


def test_without_defaults_only_configured_models_are_priced() -> None:
    assert PriceTable.from_config({}, defaults=False).lookup("gpt-5") is None


@pytest.mark.parametrize(
    ("model", "alias"),
    [("gpt-4o-2024-08-06", "gpt-4o"), ("gpt-5-mini-2025-08-07", "gpt-5-mini")],
)
def test_dated_snapshots_use_their_alias_price(model: str, alias: str) -> None:
    assert PriceTable().lookup(model) == DEFAULT_PRICES[alias]


def test_mini_is_not_priced_as_its_bigger_sibling() -> None:
    table = PriceTable()
    assert table.lookup("gpt-5-mini") != table.lookup("gpt-5")
    assert table.lookup("gpt-5-nano") not in (table.lookup("gpt-5"), table.lookup("gpt-5-mini"))
    assert table.lookup("gpt-5-pico") is None  # no prefix matching: unknown stays unpriced


# Every model the README, the docs, the recipes and the issue name (gpt-4.1 family included).
NAMED_MODELS = {
    "gpt-5", "gpt-5-mini", "gpt-5-nano", "o3", "o4-mini", "gpt-4o", "gpt-4o-mini",
    "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano",
}  # fmt: skip


def test_the_price_table_is_dated_sourced_and_complete_for_the_named_models() -> None:
    import re

    from factory.llm import pricing
    from tests.conftest import ROOT

    texts = [(ROOT / "README.md").read_text()]
    texts += [p.read_text() for p in (ROOT / "docs").rglob("*.md")]
    texts += [p.read_text() for p in (ROOT / "pipelines").glob("*.yaml")]
    named = {
        m
        for t in texts
        for m in re.findall(r"\b(gpt-[0-9][\w.]*(?:-(?:mini|nano))?|o[34](?:-mini)?)\b", t)
    }
    assert {"o3", "gpt-5-nano", "gpt-4o-mini"} <= NAMED_MODELS
    missing = sorted((named | NAMED_MODELS) - set(DEFAULT_PRICES))
    assert not missing, f"unpriced: {missing}"
    assert re.fullmatch(r"20\d\d-\d\d-\d\d", PRICES_AS_OF)
    assert "openai.com" in pricing.PRICES_SOURCE
    # Figures of OpenAI's pricing page as of PRICES_AS_OF (Standard tier).
    assert DEFAULT_PRICES["gpt-5-nano"] == Price(0.05, 0.005, 0.40)
    assert DEFAULT_PRICES["o3"] == Price(2.00, 0.50, 8.00)
    assert DEFAULT_PRICES["gpt-4o-mini"] == Price(0.15, 0.075, 0.60)


@pytest.mark.parametrize(
    "spec",
    [
        {"input_per_mtok": 1.0},
        {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "typo": 1},
        {"input_per_mtok": -1.0, "output_per_mtok": 2.0},
        {"input_per_mtok": "cheap", "output_per_mtok": 2.0},
    ],
)
def test_bad_price_config_is_a_config_error(spec: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        PriceTable.from_config({"m": spec})
    assert info.value.key_path.startswith("prices.m")


def test_anthropic_and_gemini_rows_are_sourced_dated_and_hold_their_cache_prices() -> None:
    import re

    from factory.llm.pricing import ANTHROPIC_PRICES, GEMINI_PRICES, PRICE_SOURCES

    assert set(PRICE_SOURCES) == {"openai", "anthropic", "gemini"}
    for page, as_of in PRICE_SOURCES.values():
        assert page.startswith("https://") and re.fullmatch(r"20\d\d-\d\d-\d\d", as_of)
    assert {"claude-opus-4-1", "claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5"} <= set(
        ANTHROPIC_PRICES
    )
    for p in ANTHROPIC_PRICES.values():  # the page's multipliers: write 1.25x, read 0.1x
        assert p.cache_write_per_mtok == pytest.approx(1.25 * p.input_per_mtok)
        assert p.cached_input_per_mtok == pytest.approx(0.1 * p.input_per_mtok)
        assert p.cache_storage_per_mtok_hour is None
    assert DEFAULT_PRICES["claude-sonnet-4-5"] == Price(3.0, 0.3, 15.0, cache_write_per_mtok=3.75)
    assert set(GEMINI_PRICES) == {"gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.5-flash-lite"}
    for p in GEMINI_PRICES.values():  # an implicit cache writes nothing; explicit is stored
        assert p.cache_write_per_mtok is None and p.cache_storage_per_mtok_hour
    assert DEFAULT_PRICES["gemini-2.5-pro"].input_per_mtok == 1.25  # the <=200k tier


@pytest.mark.parametrize(
    "model", ["claude-sonnet-4-5", "claude-haiku-4-5", "gemini-2.5-flash", "gemini-2.5-pro"]
)
def test_every_provider_batch_is_half_of_every_rate_but_storage(model: str) -> None:
    table = PriceTable()
    online, batch = table.lookup(model), table.lookup_batch(model)
    assert online is not None and batch is not None
    assert batch.input_per_mtok == online.input_per_mtok / 2
    assert batch.cached_input_per_mtok == online.cached_input_per_mtok / 2
    assert batch.output_per_mtok == online.output_per_mtok / 2
    if online.cache_write_per_mtok is not None:
        assert batch.cache_write_per_mtok == online.cache_write_per_mtok / 2
    assert batch.cache_storage_per_mtok_hour == online.cache_storage_per_mtok_hour


def test_a_dated_anthropic_snapshot_is_priced_as_its_alias() -> None:
    table = PriceTable()
    assert table.lookup("claude-sonnet-4-5-20250929") == DEFAULT_PRICES["claude-sonnet-4-5"]
    assert table.lookup_batch("claude-opus-4-1-20250805") == table.lookup_batch("claude-opus-4-1")


def test_a_recipe_price_carries_its_storage_and_its_providers_batch_share() -> None:
    table = PriceTable.from_config(
        {
            "gemini-2.5-flash": {
                "input_per_mtok": 0.2,
                "cached_input_per_mtok": 0.02,
                "output_per_mtok": 2.0,
                "cache_storage_per_mtok_hour": 0.5,
            }
        }
    )
    online, batch = table.lookup("gemini-2.5-flash"), table.lookup_batch("gemini-2.5-flash")
    assert online == Price(0.2, 0.02, 2.0, cache_storage_per_mtok_hour=0.5)
    assert batch == Price(0.1, 0.01, 1.0, cache_storage_per_mtok_hour=0.5)
    assert table.as_dict()["gemini-2.5-flash"]["cache_storage_per_mtok_hour"] == 0.5
    with pytest.raises(ConfigError) as info:
        PriceTable.from_config(
            {"m": {"input_per_mtok": 1, "output_per_mtok": 1, "cache_storage_per_mtok_hour": -1}}
        )
    assert info.value.key_path == "prices.m.cache_storage_per_mtok_hour"
