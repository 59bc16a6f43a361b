"""The envsim job's quota counting (``QuotaFill``): what the candidates so far could fill."""

from __future__ import annotations

from pathlib import Path

from factory.core.mixture import Mixture
from factory.engine.jobs.envsim import QuotaFill


def _mixture(tmp_path: Path, extra: str = "") -> Mixture:
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: m\n" + extra + "quotas:\n"
        "  - {name: fail, count: 2, outcome: failure}\n"
        "  - {name: any, count: 3, outcome: [failure, change, no_change]}\n"
    )
    return Mixture.load(path)


def test_each_candidate_counts_for_its_first_quota(tmp_path: Path) -> None:
    fill = QuotaFill(_mixture(tmp_path), tools=["a", "b"])
    for outcome in ("failure", "failure", "failure", "change"):
        fill.add({"outcome": outcome, "tool": "a"})
    # the third failure counts for "fail" too (its first match), already full: as the
    # selection will see it, it cannot fill "any"
    assert fill.rows == 2 + 1 and not fill.met
    fill.add({"outcome": "change", "tool": "b"})
    assert fill.rows == 4 and not fill.met
    fill.add({"outcome": "no_change", "tool": "b"})
    assert fill.rows == 5 and fill.met


def test_tool_balance_and_caps(tmp_path: Path) -> None:
    fill = QuotaFill(_mixture(tmp_path, "min_per_tool: 1\nmax_per_tool: 2\n"), tools=["a", "b"])
    for _ in range(5):
        fill.add({"outcome": "change", "tool": "a"})
    assert fill.rows == 2 and not fill.balanced  # a's 3rd..5th pass over the cap; b missing
    fill.add({"outcome": "failure", "tool": "b"})
    fill.add({"outcome": "failure", "tool": "b"})
    assert fill.balanced and fill.rows == 4
