"""The run report (``OUT/report.html``): what it shows, from a hand-built folder.

The browser check of a real run's report is in ``tests/e2e/test_report.py``.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from factory.errors import ConfigError
from factory.io.report import write_report
from factory.io.report.folder import reservoir
from tests.helpers.reportfolder import make_folder


def _plots(page: str) -> list[str]:
    """The SVG documents of the page's plots."""
    uris = re.findall(
        r'<img class="plot" alt="[^"]*" src="data:image/svg\+xml;base64,([^"]+)"', page
    )
    return [base64.b64decode(u).decode() for u in uris]


EXTRA = {
    "diversity": {"distinct_tool_sequences": 7, "tools_per_row": {"1": 4, "2": 8}},
    "near_duplicates": {"removed": 3, "threshold": 0.85},
}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The report of the hand-built folder (built once: plots take a moment)."""
    out = make_folder(tmp_path_factory.mktemp("report") / "o")
    return write_report(out).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def page_with_more(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same folder's report with manifest sections other features add."""
    out = make_folder(tmp_path_factory.mktemp("report") / "o", extra=EXTRA)
    return write_report(out).read_text(encoding="utf-8")


def test_the_report_is_one_file_with_every_section_and_its_plots_inlined(page: str) -> None:
    # Self-contained: nothing is fetched (no src/href to a URL, no script at all).
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<script" not in page
    for title in ("Funnel", "Reasons", "Distributions", "Tool coverage", "Per-seed yield",
                  "Tokens and cost per stage", "Throughput and cost over time",
                  "Response cache", "Samples"):  # fmt: skip
        assert f"<h2>{title}</h2>" in page
    svgs = _plots(page)
    assert len(svgs) >= 10 and all(s.lstrip().startswith(("<?xml", "<svg")) for s in svgs)
    alts = re.findall(r'<img class="plot" alt="([^"]*)"', page)
    for plot in ("Funnel", "Reasons", "Outcome", "Argument cardinality", "Calls per tool",
                 "Seeds by accepted rows", "Cost per stage (USD)", "Rows over time",
                 "Throughput", "Cost over time"):  # fmt: skip
        assert plot in alts
    # The funnel's numbers, the reasons, the stages' cost, the cache share.
    assert "malformed_json" in page and "seeds kept" in page
    assert "accepted + surplus + rejected + failed = total: holds" in page
    assert "0.0404" in page  # amplify's cost
    assert "share of LLM requests answered from the cache" in page
    # Tool coverage counts the tool never called too.
    assert "2 of 3 tools called" in page
    # Rendered conversations: what the user said, the call, the answer.
    assert "I want to cancel booking" in page and "get_user_details" in page
    assert 'class="turn function_call"' in page and "seed_id=seed-" in page
    assert "the answer at call 0 could not be used" in page  # a reject example


def test_tool_coverage_bars_carry_the_tool_names(page: str) -> None:
    coverage = next(
        s for s in _plots(page) if "Calls per tool" in s
    )  # svg.fonttype none: labels are text in the SVG
    for tool in ("get_user_details", "cancel_reservation", "transfer_to_human_agents"):
        assert tool in coverage


def test_sections_added_by_other_features_are_shown_and_absent_ones_skipped(
    page: str, page_with_more: str
) -> None:
    assert "More from the manifest" not in page  # nothing unknown: no empty section
    assert "More from the manifest" in page_with_more
    assert "distinct_tool_sequences" in page_with_more and "near_duplicates" in page_with_more
    alts = re.findall(r'<img class="plot" alt="([^"]*)"', page_with_more)
    assert "diversity / tools_per_row" in alts  # a numeric mapping becomes a bar plot


def test_a_folder_without_time_series_or_llm_still_reports(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    import json

    m = json.loads((out / "manifest.json").read_text())
    for key in ("timeline", "by_stage", "tokens", "seeds", "calls", "responses_from_cache"):
        m.pop(key)
    (out / "manifest.json").write_text(json.dumps(m))
    page = write_report(out).read_text(encoding="utf-8")
    assert "This run recorded no time series." in page
    assert "This run made no LLM call." in page


def test_a_folder_that_is_not_a_run_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no manifest\.json"):
        write_report(tmp_path)


def test_the_samples_are_deterministic_and_spread_over_the_stream() -> None:
    first = reservoir(range(1000), 5, seed=0)
    assert first == reservoir(range(1000), 5, seed=0) and first == sorted(first)
    assert len(first) == 5 and first[-1] > 100  # not simply the first five rows
    assert reservoir(range(3), 5) == [0, 1, 2]


def test_an_envsim_report_shows_step_samples_and_the_step_histograms(tmp_path: Path) -> None:
    from tests.helpers.reportfolder import make_envsim_folder

    page = write_report(make_envsim_folder(tmp_path / "o")).read_text(encoding="utf-8")
    alts = re.findall(r'<img class="plot" alt="([^"]*)"', page)
    assert "|Δ| (state-change ops)" in alts and "Argument cardinality" in alts
    assert "Calls per tool" in alts and "1 of 1 tools called" in page
    assert "step samples drawn at random" in page and "cancelled R00" in page
    assert "Mixture balance: quotas" in page
