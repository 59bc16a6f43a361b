"""USD cost of a completion from its ``usage`` block.

OpenAI reports ``prompt_tokens`` *including* the cached ones
(``prompt_tokens_details.cached_tokens`` is a subset, billed at the cached
rate) and ``completion_tokens`` *including* the hidden reasoning tokens
(``completion_tokens_details.reasoning_tokens``, billed as output). Some
OpenAI-compatible servers report reasoning tokens outside ``completion_tokens``;
that case is recognised from ``total_tokens`` so reasoning is billed as output
exactly once either way.

Prices change; the built-in table is a convenience marked with the date it was
read, and a recipe's ``prices`` section overrides or extends it. Models not in
the table (local vLLM / SGLang models) cost 0 unless the recipe prices them, and
a ``max_cost_usd`` cap over such a model is refused (``budget.check_cost_cap_priced``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from factory.errors import ConfigError, short

__all__ = [
    "BATCH_PRICES_SOURCE",
    "DEFAULT_BATCH_PRICES",
    "DEFAULT_PRICES",
    "PRICES_AS_OF",
    "PRICES_SOURCE",
    "Price",
    "PriceTable",
    "add_usage",
    "cost",
    "token_counts",
]

_MTOK = 1_000_000


@dataclass(frozen=True)
class Price:
    """USD per million tokens. ``cached_input_per_mtok`` applies to cache hits."""

    input_per_mtok: float
    cached_input_per_mtok: float
    output_per_mtok: float

    def __post_init__(self) -> None:
        for name in ("input_per_mtok", "cached_input_per_mtok", "output_per_mtok"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"expected a non-negative number, got {short(value, 40)}",
                    key_path=name,
                )


# Source: OpenAI's public API pricing page (https://openai.com/api/pricing/, Standard
# tier: not Batch, Flex or Priority), USD per million tokens (input, cached input,
# output), as of the date below (the GPT-5 launch, with o3 after its June 2025 cut).
# Check the page before a large run and put newer figures under ``prices:`` in the
# recipe; a recipe price always wins over this table.
PRICES_AS_OF = "2025-08-07"
PRICES_SOURCE = "https://openai.com/api/pricing/ (Standard tier)"
DEFAULT_PRICES: dict[str, Price] = {
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

# The Batch tier of the same page, as of the same date: half the Standard rate, input,
# cached input and output alike (OpenAI Batch API, 24h completion window). A model not
# listed here is priced at its online rate in a batch unless the recipe gives its
# ``prices.<model>.batch_share`` (never a discount nobody stated); a recipe price of a
# listed model gets the Batch tier's share of it.
BATCH_PRICES_SOURCE = "https://openai.com/api/pricing/ (Batch tier)"
_BATCH_SHARE = 0.5
DEFAULT_BATCH_PRICES: dict[str, Price] = {
    model: Price(
        p.input_per_mtok * _BATCH_SHARE,
        p.cached_input_per_mtok * _BATCH_SHARE,
        p.output_per_mtok * _BATCH_SHARE,
    )
    for model, p in DEFAULT_PRICES.items()
    if model in ("gpt-5", "gpt-5-mini", "gpt-5-nano", "o3", "o4-mini", "gpt-4.1", "gpt-4o")
}

# Dated snapshots ("gpt-4o-2024-08-06") are priced like their alias.
_SNAPSHOT_RE = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> int:
    return int(value) if _is_number(value) else 0


def token_counts(usage: Mapping[str, Any] | Any) -> tuple[int, int, int]:
    """Split a usage block into (uncached prompt, cached prompt, output) tokens.

    Args:
        usage: a chat-completions ``usage`` mapping (or an SDK object with ``model_dump``).

    Returns:
        Billable token counts; output includes reasoning tokens exactly once.
    """
    if usage is None:
        return 0, 0, 0
    if not isinstance(usage, Mapping):
        usage = usage.model_dump()
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    cached = min(_int(prompt_details.get("cached_tokens")), prompt)
    reasoning = _int(completion_details.get("reasoning_tokens"))
    total = usage.get("total_tokens")
    if reasoning and _int(total) == prompt + completion + reasoning:
        completion += reasoning  # reported beside completion_tokens, not inside it
    return prompt - cached, cached, completion


def add_usage(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two usage blocks as one: numbers added, nested blocks (``prompt_tokens_details``
    ...) added key by key, anything else taken from ``a``. For two paid answers to
    one request (a hedge that answered too): both count in tokens as in cost."""
    out: dict[str, Any] = dict(a)
    for key, value in b.items():
        mine = out.get(key)
        if isinstance(value, Mapping) and (mine is None or isinstance(mine, Mapping)):
            out[key] = add_usage(mine or {}, value)
        elif _is_number(value) and (mine is None or _is_number(mine)):
            out[key] = (mine or 0) + value
        else:
            out.setdefault(key, value)
    return out


def cost(usage: Mapping[str, Any] | Any, price: Price | None) -> float:
    """USD cost of one completion.

    Args:
        usage: the response's ``usage`` block (mapping or SDK object); ``None`` costs 0.
        price: the model's price, or ``None`` for an unpriced (local) model.

    Returns:
        Cost in USD; 0.0 when ``price`` is ``None``.
    """
    if price is None:
        return 0.0
    uncached, cached, output = token_counts(usage)
    return (
        uncached * price.input_per_mtok
        + cached * price.cached_input_per_mtok
        + output * price.output_per_mtok
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
        return Price(input_price, input_price if cached is None else cached, output_price)
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
        for model in prices or {}:  # a recipe price of a listed model: the Batch tier's share
            if model in DEFAULT_BATCH_PRICES:
                shares.setdefault(model, _BATCH_SHARE)
        for model, share in shares.items():
            online = self._prices.get(model)
            if online is not None:
                self._batch[model] = Price(
                    online.input_per_mtok * share,
                    online.cached_input_per_mtok * share,
                    online.output_per_mtok * share,
                )

    @classmethod
    def from_config(cls, prices: Mapping[str, Any] | None, *, defaults: bool = True) -> PriceTable:
        """Build from a recipe's ``prices`` section.

        Args:
            prices: model id -> mapping (or pydantic model) with ``input_per_mtok``,
                ``output_per_mtok`` and optional ``cached_input_per_mtok`` (default:
                the input price, i.e. no cache discount).
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
        """Price of ``model`` through a batch API (``openai_batch``): the Batch tier when
        known, else the online price (no discount assumed); unknown -> None."""
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
        return {
            model: {
                "input_per_mtok": p.input_per_mtok,
                "cached_input_per_mtok": p.cached_input_per_mtok,
                "output_per_mtok": p.output_per_mtok,
            }
            for model, p in sorted(self._prices.items())
        }
