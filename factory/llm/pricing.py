"""USD cost of a completion from its token ``Usage``.

A backend maps its provider's usage block to ``factory.llm.types.Usage`` (input with its
cached and cache-written parts, output with its reasoning part); this module prices
that, whatever the provider: uncached input at the input rate, cache reads at the cached
rate, cache writes at the cache-write rate (the input rate unless a price says
otherwise: OpenAI-compatible servers never report a cache write), output (reasoning
included) at the output rate.

Prices change; the built-in table is a convenience: one table for every provider
(OpenAI, Anthropic, Gemini), each provider's rows marked with the page they were read
from and when (``PRICE_SOURCES``), and a recipe's ``prices`` section overrides or extends
it. A batch API's price is a share of the online price (``batch_share``: 0.5 for every
batch API the table lists), so one mechanism prices both (``lookup`` / ``lookup_batch``).
Models not in the table (local vLLM / SGLang models) cost 0 unless the recipe prices
them, and a ``max_cost_usd`` cap over such a model is refused
(``budget.check_cost_cap_priced``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from factory.errors import ConfigError, short
from factory.llm.types import Usage

__all__ = [
    "ANTHROPIC_PRICES",
    "BATCH_PRICES_SOURCE",
    "BATCH_SHARES",
    "DEFAULT_BATCH_PRICES",
    "DEFAULT_PRICES",
    "GEMINI_PRICES",
    "OPENAI_PRICES",
    "PRICES_AS_OF",
    "PRICES_SOURCE",
    "PRICE_SOURCES",
    "Price",
    "PriceTable",
    "cost",
    "explicit_cache_pays",
]

_MTOK = 1_000_000


@dataclass(frozen=True)
class Price:
    """USD per million tokens. ``cached_input_per_mtok`` applies to cache reads,
    ``cache_write_per_mtok`` to tokens written to a provider's prompt cache (``None``:
    the input price, what a provider that reports no cache write means);
    ``cache_storage_per_mtok_hour`` is what an explicit context cache costs to keep, per
    million tokens per hour (Gemini's ``cachedContents``; ``None``: the provider has
    none). Storage is not a per-call price: a run's cost from its ``Usage`` never
    includes it; the plan estimates it (``factory.llm.costs``)."""

    input_per_mtok: float
    cached_input_per_mtok: float
    output_per_mtok: float
    cache_write_per_mtok: float | None = None
    cache_storage_per_mtok_hour: float | None = None

    def __post_init__(self) -> None:
        for name in ("input_per_mtok", "cached_input_per_mtok", "output_per_mtok"):
            _check(name, getattr(self, name))
        for name in ("cache_write_per_mtok", "cache_storage_per_mtok_hour"):
            if getattr(self, name) is not None:
                _check(name, getattr(self, name))

    def scaled(self, share: float) -> Price:
        """Every per-token rate times ``share`` (a batch API's discount); storage is
        billed by the hour whoever reads the cache, so it keeps its price."""
        write = self.cache_write_per_mtok
        return Price(
            self.input_per_mtok * share,
            self.cached_input_per_mtok * share,
            self.output_per_mtok * share,
            None if write is None else write * share,
            self.cache_storage_per_mtok_hour,
        )


def _check(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"expected a non-negative number, got {short(value, 40)}", key_path=name)


# Source: OpenAI's public API pricing page (https://openai.com/api/pricing/, Standard
# tier: not Batch, Flex or Priority), USD per million tokens (input, cached input,
# output), as of the date below (the GPT-5 launch, with o3 after its June 2025 cut).
# OpenAI bills no cache write: the first call of a prefix pays the input rate.
# Check the page before a large run and put newer figures under ``prices:`` in the
# recipe; a recipe price always wins over this table.
PRICES_AS_OF = "2025-08-07"
PRICES_SOURCE = "https://openai.com/api/pricing/ (Standard tier)"
OPENAI_PRICES: dict[str, Price] = {
    "gpt-5": Price(1.25, 0.125, 10.00),
    "gpt-5-mini": Price(0.25, 0.025, 2.00),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "o3": Price(2.00, 0.50, 8.00),
    "o4-mini": Price(1.10, 0.275, 4.40),
    "gpt-4o": Price(2.50, 1.25, 10.00),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "gpt-4.1": Price(2.00, 0.50, 8.00),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
}

# Source: Anthropic's pricing page (https://docs.claude.com/en/docs/about-claude/pricing,
# "Model pricing": base input, 5-minute cache writes, cache hits and refreshes, output),
# USD per million tokens, as of ANTHROPIC_PRICES_AS_OF. A 5-minute cache write is 1.25x
# the input price and a cache read 0.1x (the page's multipliers; the 1-hour cache, 2x,
# is not what the factory asks for). Message Batches bill 50% of every rate, cache
# writes and reads included (the page's "Batch processing"; they stack with caching).
# Prompts above 200k tokens on a 1M-context Sonnet cost more: the table is the
# standard (<=200k) tier, which a factory prompt (a few thousand tokens) always is.
ANTHROPIC_PRICES_AS_OF = "2026-11-28"
ANTHROPIC_PRICES_SOURCE = "https://docs.claude.com/en/docs/about-claude/pricing"
ANTHROPIC_PRICES: dict[str, Price] = {
    "claude-opus-4-1": Price(15.00, 1.50, 75.00, cache_write_per_mtok=18.75),
    "claude-opus-4-5": Price(5.00, 0.50, 25.00, cache_write_per_mtok=6.25),
    "claude-sonnet-4-5": Price(3.00, 0.30, 15.00, cache_write_per_mtok=3.75),
    "claude-haiku-4-5": Price(1.00, 0.10, 5.00, cache_write_per_mtok=1.25),
}

# Source: Google's Gemini Developer API pricing page
# (https://ai.google.dev/gemini-api/docs/pricing, Paid tier, Standard: text input,
# context caching price, output including thinking tokens, context cache storage per
# million tokens per hour), USD, as of GEMINI_PRICES_AS_OF. Gemini bills no cache
# write for its implicit cache; an explicit cache's tokens are stored by the hour. The
# Batch API bills 50% of the token rates. Gemini 2.5 Pro doubles its input and caching
# rates (and raises output to $15) for prompts above 200k tokens: the table is the
# <=200k tier, which a factory prompt (a few thousand tokens) always is.
GEMINI_PRICES_AS_OF = "2026-11-28"
GEMINI_PRICES_SOURCE = "https://ai.google.dev/gemini-api/docs/pricing"
GEMINI_PRICES: dict[str, Price] = {
    "gemini-2.5-pro": Price(1.25, 0.125, 10.00, cache_storage_per_mtok_hour=4.50),
    "gemini-2.5-flash": Price(0.30, 0.03, 2.50, cache_storage_per_mtok_hour=1.00),
    "gemini-2.5-flash-lite": Price(0.10, 0.01, 0.40, cache_storage_per_mtok_hour=1.00),
}

#: Provider -> (the page its rows were read from, as of when).
PRICE_SOURCES: dict[str, tuple[str, str]] = {
    "openai": (PRICES_SOURCE, PRICES_AS_OF),
    "anthropic": (ANTHROPIC_PRICES_SOURCE, ANTHROPIC_PRICES_AS_OF),
    "gemini": (GEMINI_PRICES_SOURCE, GEMINI_PRICES_AS_OF),
}
DEFAULT_PRICES: dict[str, Price] = {**OPENAI_PRICES, **ANTHROPIC_PRICES, **GEMINI_PRICES}

# The batch APIs' share of the online price, per model: OpenAI's Batch tier (same page,
# same date: half the Standard rate, input, cached input and output alike; 24h window),
# Anthropic's Message Batches and Gemini's Batch API (50% each, pages above). A model
# not listed here is priced at its online rate in a batch unless the recipe gives its
# ``prices.<model>.batch_share`` (never a discount nobody stated); a recipe price of a
# listed model gets its provider's share of it.
BATCH_PRICES_SOURCE = "https://openai.com/api/pricing/ (Batch tier)"
_BATCH_SHARE = 0.5
BATCH_SHARES: dict[str, float] = {
    **{
        model: _BATCH_SHARE
        for model in ("gpt-5", "gpt-5-mini", "gpt-5-nano", "o3", "o4-mini", "gpt-4.1", "gpt-4o")
    },
    **dict.fromkeys(ANTHROPIC_PRICES, _BATCH_SHARE),
    **dict.fromkeys(GEMINI_PRICES, _BATCH_SHARE),
}
DEFAULT_BATCH_PRICES: dict[str, Price] = {
    model: DEFAULT_PRICES[model].scaled(share) for model, share in BATCH_SHARES.items()
}

# Dated snapshots ("gpt-4o-2024-08-06", "claude-sonnet-4-5-20250929") are priced like
# their alias.
_SNAPSHOT_RE = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|20\d{6})$")


def cost(usage: Usage | None, price: Price | None) -> float:
    """USD cost of one completion (or of several: usages add).

    Args:
        usage: the tokens it used; ``None`` costs 0.
        price: the model's price, or ``None`` for an unpriced (local) model.

    Returns:
        Cost in USD; 0.0 when ``price`` is ``None``.
    """
    if price is None or usage is None:
        return 0.0
    write = price.cache_write_per_mtok
    return (
        usage.uncached_input * price.input_per_mtok
        + usage.cached_input * price.cached_input_per_mtok
        + usage.cache_write * (price.input_per_mtok if write is None else write)
        + usage.output * price.output_per_mtok
    ) / _MTOK


def _price_from(model: str, spec: Any) -> Price:
    if isinstance(spec, Price):
        return spec
    if not isinstance(spec, Mapping):
        spec = spec.model_dump() if hasattr(spec, "model_dump") else vars(spec)
    unknown = set(spec) - {
        "input_per_mtok",
        "cached_input_per_mtok",
        "output_per_mtok",
        "cache_write_per_mtok",
        "cache_storage_per_mtok_hour",
        "batch_share",
    }
    if unknown:
        raise ConfigError(f"unknown price field {sorted(unknown)[0]!r}", key_path=f"prices.{model}")
    try:
        input_price = spec["input_per_mtok"]
        output_price = spec["output_per_mtok"]
    except KeyError as exc:
        raise ConfigError(f"missing {exc.args[0]}", key_path=f"prices.{model}") from exc
    cached = spec.get("cached_input_per_mtok")
    try:
        return Price(
            input_price,
            input_price if cached is None else cached,
            output_price,
            spec.get("cache_write_per_mtok"),
            spec.get("cache_storage_per_mtok_hour"),
        )
    except ConfigError as exc:
        raise ConfigError(
            str(exc).split(": ", 1)[-1], key_path=f"prices.{model}.{exc.key_path}"
        ) from None


class PriceTable:
    """Model id -> ``Price``: the built-in defaults overlaid with the recipe's prices."""

    def __init__(
        self,
        prices: Mapping[str, Price] | None = None,
        *,
        defaults: bool = True,
        batch_shares: Mapping[str, float] | None = None,
    ):
        self._prices: dict[str, Price] = dict(DEFAULT_PRICES) if defaults else {}
        self._prices.update(prices or {})
        self._batch: dict[str, Price] = dict(DEFAULT_BATCH_PRICES) if defaults else {}
        shares = dict(batch_shares or {})
        for model in prices or {}:  # a recipe price of a listed model: its batch API's share
            if model in BATCH_SHARES:
                shares.setdefault(model, BATCH_SHARES[model])
        for model, share in shares.items():
            online = self._prices.get(model)
            if online is not None:
                self._batch[model] = online.scaled(share)

    @classmethod
    def from_config(cls, prices: Mapping[str, Any] | None, *, defaults: bool = True) -> PriceTable:
        """Build from a recipe's ``prices`` section.

        Args:
            prices: model id -> mapping (or pydantic model) with ``input_per_mtok``,
                ``output_per_mtok`` and optional ``cached_input_per_mtok`` (default:
                the input price, i.e. no cache discount) and ``cache_write_per_mtok``
                (default: the input price), ``cache_storage_per_mtok_hour`` (an
                explicit cache's storage) and ``batch_share``.
            defaults: start from ``DEFAULT_PRICES`` (as of ``PRICES_AS_OF``).

        Raises:
            ConfigError: a missing or unknown field, or a negative price.
        """
        parsed = {model: _price_from(model, spec) for model, spec in (prices or {}).items()}
        shares: dict[str, float] = {}
        for model, spec in (prices or {}).items():
            raw = spec.get("batch_share") if isinstance(spec, Mapping) else None
            if raw is None:
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= 1:
                raise ConfigError(
                    f"expected a share in (0, 1], got {short(raw, 40)}",
                    key_path=f"prices.{model}.batch_share",
                )
            shares[model] = float(raw)
        return cls(parsed, defaults=defaults, batch_shares=shares)

    def lookup(self, model: str) -> Price | None:
        """Price of ``model``; a dated snapshot falls back to its alias; unknown -> None."""
        if model in self._prices:
            return self._prices[model]
        alias = _SNAPSHOT_RE.sub("", model)
        return self._prices.get(alias)

    def lookup_batch(self, model: str) -> Price | None:
        """Price of ``model`` through a batch API (a backend whose plug-in is ``batched``):
        its batch share of the online price when known, else the online price (no
        discount assumed); unknown -> None."""
        for name in (model, _SNAPSHOT_RE.sub("", model)):
            if name in self._batch:
                return self._batch[name]
            if name in self._prices:
                return self._prices[name]
        return None

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.lookup(model) is not None

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Plain mapping for the run manifest (so a run records the prices it used)."""
        out: dict[str, dict[str, float]] = {}
        for model, p in sorted(self._prices.items()):
            out[model] = {
                "input_per_mtok": p.input_per_mtok,
                "cached_input_per_mtok": p.cached_input_per_mtok,
                "output_per_mtok": p.output_per_mtok,
            }
            if p.cache_write_per_mtok is not None:  # only where a price gives one
                out[model]["cache_write_per_mtok"] = p.cache_write_per_mtok
            if p.cache_storage_per_mtok_hour is not None:
                out[model]["cache_storage_per_mtok_hour"] = p.cache_storage_per_mtok_hour
        return out


def explicit_cache_pays(
    prefix_tokens: int,
    calls_expected: float,
    price: Price | None,
    ttl_s: float,
    storage_per_mtok_hour: float | None,
    *,
    min_tokens: int,
    implicit_hit_share: float = 0.0,
) -> bool:
    """Whether an explicit cache of a ``prefix_tokens`` prefix, used by ``calls_expected``
    calls within one ``ttl_s``, costs less than sending the prefix with every call.

    Saved per call: the prefix at the input rate less the cached rate, for the share of
    calls the implicit cache would not have hit anyway (``implicit_hit_share``: Google
    guarantees none, so the backend counts none). Paid once per TTL: the prefix at the
    input rate (making the cache) and its storage for the TTL.

    Returns False where it cannot pay or cannot be known to: a prefix shorter than the
    model caches, no price, or no storage rate.
    """
    if prefix_tokens < min_tokens or price is None or storage_per_mtok_hour is None:
        return False
    per_call = prefix_tokens * (price.input_per_mtok - price.cached_input_per_mtok) / 1e6
    saved = calls_expected * per_call * (1.0 - implicit_hit_share)
    made = prefix_tokens * price.input_per_mtok / 1e6
    stored = prefix_tokens * storage_per_mtok_hour * (ttl_s / 3600.0) / 1e6
    return saved > made + stored
