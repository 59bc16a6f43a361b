"""The run's one-screen summary: what the output cost and what this run paid."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.engine.result import RunResult, cost_line


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        ({"cost_usd": 0.98, "cost_usd_paid_this_run": 0.98}, "cost 0.9800 USD"),
        ({"cost_usd": 0.5}, "cost 0.5000 USD"),  # a manifest from before the field
        (
            {"cost_usd": 5.98, "cost_usd_paid_this_run": 0.98},
            "paid by this run 0.9800 USD; cost of the whole output 5.9800 USD",
        ),
        (
            {"cost_usd": 5.98, "cost_usd_paid_this_run": 0.0},
            "paid by this run 0.0000 USD; cost of the whole output 5.9800 USD",
        ),
    ],
)
def test_an_extended_run_shows_what_it_paid_beside_the_whole_cost(manifest, expected) -> None:
    assert cost_line(manifest).startswith(expected)
    tokens = {"prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 0}
    summary = RunResult(Path("o"), {}, {**manifest, "tokens": tokens}).summary()
    assert expected in summary


def _ledger(price):
    import json

    from factory.engine.ledger import Ledger
    from factory.engine.work import ItemResult

    ledger = Ledger(prices={"prefilter": (price, None), "amplify": (price, None)})
    for stage, cached in (("prefilter", 200), ("amplify", 7000)):
        used = {"prompt_tokens": 10_000, "completion_tokens": 500, "cached_tokens": cached}
        row = {"llm_stage": stage, "usage": json.dumps(used), "cost_usd": 0.01, "calls": 1}
        ledger.arrived(ItemResult("calls", 0, [row]))
    return ledger


def _summary(price, accepted: int) -> dict:
    from factory.engine.result import cost_summary
    from factory.io.writer import Manifest

    ledger = _ledger(price)
    manifest = Manifest(recipe="r", config_hash="h")
    manifest.extra.update(ledger.manifest_fields())
    return {**manifest.extra, "cost_summary": cost_summary(manifest, ledger, accepted)}


def test_the_cost_per_thousand_accepted_rows_heads_the_cost_block() -> None:
    from factory.engine.result import cost_lines
    from factory.llm.pricing import PriceTable

    manifest = _summary(PriceTable().lookup("gpt-5"), accepted=40)
    summary = manifest["cost_summary"]
    cost = manifest["cost_usd"]
    assert summary["per_1k_accepted_usd"] == pytest.approx(cost * 1000 / 40)
    assert summary["cache_read_share"] == pytest.approx(7200 / 20_000)
    assert summary["cache_saved_usd"] == pytest.approx(7200 * (1.25 - 0.125) / 1e6)
    assert summary["batch_saved_usd"] is None  # online: nothing batched
    lines = cost_lines(manifest)
    assert lines[0].startswith(f"cost: {summary['per_1k_accepted_usd']:,.4f} USD per 1,000")
    assert summary["per_1k_accepted_usd"] < 1  # cents from 1 USD up: 4 decimals below
    assert "36.0% read from the provider's prompt cache" in lines[1]
    assert lines[2].startswith("  caching saved 0.0081 USD")
    assert lines[3] == "  cache read by stage: prefilter 2.0%, amplify 70.0%"
    summary_text = RunResult(Path("o"), {"accepted": 40}, manifest).summary()
    assert "\n".join(lines) in summary_text


def test_a_run_with_no_priced_model_shows_the_share_and_no_dollars() -> None:
    from factory.engine.result import cost_lines

    manifest = _summary(None, accepted=40)
    summary = manifest["cost_summary"]
    assert not summary["priced"] and summary["unpriced_stages"] == ["amplify", "prefilter"]
    assert summary["per_1k_accepted_usd"] is None and summary["cache_saved_usd"] is None
    assert summary["cache_read_share"] == pytest.approx(0.36)
    text = "\n".join(cost_lines(manifest))
    assert "USD per 1,000" not in text and "saved" not in text
    assert "no priced model" in text and "36.0% read from the provider's prompt cache" in text


def test_no_accepted_row_has_no_cost_per_thousand() -> None:
    from factory.llm.pricing import PriceTable

    manifest = _summary(PriceTable().lookup("gpt-5"), accepted=0)
    assert manifest["cost_summary"]["per_1k_accepted_usd"] is None
    assert "(no accepted row)" in RunResult(Path("o"), {}, manifest).summary()
