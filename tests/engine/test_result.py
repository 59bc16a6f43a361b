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
