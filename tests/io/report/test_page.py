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
    "diversity": {
        "distinct_tool_sequences": 7,
        "tools_per_row": {"rows": 12, "histogram": {"1": 4, "2": 8}},
    },
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
    more = page_with_more.split("<h2>More from the manifest</h2>")[1].split("</section>")[0]
    assert "distinct tool sequences" in more and "<h3>near_duplicates</h3>" in more
    assert "<td>removed</td>" in more and "<td>threshold</td>" in more  # key: value rows
    assert "<td><table" not in more  # no nested dump
    assert ">None<" not in more  # no section of nothing
    alts = re.findall(r'<img class="plot" alt="([^"]*)"', more)
    assert alts == ["Distinct tools per row"]  # a histogram the manifest has, plotted once


def test_more_from_the_manifest_shows_tables_and_plots_never_dumps() -> None:
    from factory.io.report.more import label_order, more_sections

    manifest = {
        "batches": None,  # an absent feature: no section
        "decontamination": None,
        "budget": {"max_cost_usd": 2000.0, "max_tokens": None, "cost_usd": 0.7, "calls": 101},
        "diversity": {
            "rows": 60,
            "tool_calls": {"a": 3},  # plotted by Tool coverage: not again
            "tokens": {"histogram": {"64": 3}},  # the training fit plots the tokens
            "user_distinct_ngrams": {"1": {"distinct": 463, "total": 2134, "ratio": 0.217}},
            "labels": {"arg_cardinality": {"1": 24, "11": 14, "2": 5}, "env_id": {"None": 60},
                       "kind": {"trajectory": 60}, "write_calls": {"1": 31, "10": 2, "2": 4}},
        },
        "serve": {"replicas": [{"url": "http://h:8000", "restarts": 0}]},
    }  # fmt: skip
    html = more_sections(manifest, known=set())
    assert "<h3>batches</h3>" not in html and "<h3>decontamination</h3>" not in html
    assert "<h3>grounding</h3>" not in html  # budget and grounding only when present
    assert "<td>cost (USD)</td>" in html and "no cap" in html
    # ratios are a column of a table, never bars beside counts
    assert "<td>1-grams</td>" in html and "0.217" in html
    assert "<td>kind</td><td>trajectory</td>" in html and "env_id" not in html
    assert "replicas.0.url" in html and "<td><table" not in html
    alts = re.findall(r'<img class="plot" alt="([^"]*)"', html)
    assert alts == ["Label write_calls"]  # arg_cardinality is plotted by Distributions
    assert list(label_order({"1": 0, "11": 0, "2": 0, "None": 0})) == ["1", "2", "11", "None"]
    groups = ("Failure", "No-Change", "Simple", "Medium")
    assert list(label_order({"Simple": 9, "Failure": 1, "Medium": 5}, groups)) == [
        "Failure", "Simple", "Medium"
    ]  # fmt: skip


def test_histogram_bars_are_as_wide_as_their_bins() -> None:
    from factory.io.report.plots import _histogram_axes, binned, nice_width

    counts, width = binned([150, 151, 1230, 4500, 4499, 30_000])
    assert width == nice_width(30_000 - 150 + 1) == 1000 and min(counts) == 0
    _fig, ax = _histogram_axes(counts, bin_width=width, marker=("cutoff_len", 4608))
    bars = list(ax.patches)
    assert len(bars) == len(counts) and {b.get_width() for b in bars} == {1000}
    assert [b.get_x() for b in bars] == sorted(counts)  # a bar starts where its bin does
    _fig, ax = _histogram_axes({1: 3, 2: 5, 11: 1}, bin_width=1, marker=None)
    assert [round(b.get_x() + b.get_width() / 2) for b in ax.patches] == [1, 2, 11]


def test_throughput_is_drawn_over_the_phase_rows_arrive_in() -> None:
    from factory.io.report.page import throughput

    # 9.8 s of start-up (two points without a row), then 500 rows in 0.8 s
    seconds, total = [9.6, 9.8, 10.1, 10.6], [0, 0, 200, 500]
    starts, rates = throughput(seconds, total, bins=8)
    assert starts[0] == 9.8 and starts[-1] == 10.6  # the phase, not the whole run
    width = starts[1] - starts[0]
    assert sum(rates[:-1]) * width == pytest.approx(500)  # every row counted once
    # the rows between two points spread over the time between them: no empty window
    assert rates[0] == pytest.approx(200 / 0.3) and rates[-2] == pytest.approx(300 / 0.5)
    assert min(rates) > 0 and len(rates) == len(starts)
    assert throughput([1.0, 2.0], [0, 0]) == ([], [])  # no row: no plot


def test_throughput_counts_rows_of_the_timelines_first_point() -> None:
    from factory.io.report.page import throughput

    starts, rates = throughput([43.8, 43.9], [1, 60], bins=10)  # the first result, a row
    assert starts[0] == 43.8 and starts[-1] == pytest.approx(43.9)
    assert sum(rates[:-1]) * (starts[1] - starts[0]) == pytest.approx(60)
    starts, rates = throughput([5.0], [7], bins=4)  # one point: its rate since 0 s
    assert starts[0] == 0 and sum(rates[:-1]) * 1.25 == pytest.approx(7)


def test_the_funnel_names_no_rounds_where_the_engine_had_none(page: str) -> None:
    funnel = page.split("<h2>Funnel</h2>")[1].split("</section>")[0]
    assert "<td>calls issued</td>" in funnel and "rounds" not in funnel


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
    # the domain's tools (the manifest's, as step samples carry no list), the unused named
    assert "Calls per tool" in alts and "1 of 3 tools called" in page
    assert (
        "<b>Never called:</b> <code>get_user_details</code>, <code>list_all_airports</code>" in page
    )
    assert "step samples drawn at random" in page and "cancelled R00" in page
    assert "Mixture balance: quotas" in page


def test_the_report_opens_with_the_cost_per_thousand_accepted_rows(page: str) -> None:
    first = page.index("<section")
    assert page.index('<section id="headline"><h2>Cost per 1,000 accepted rows</h2>') == first
    headline = page[first : page.index("</section>", first)]
    rows = 12  # make_folder's accepted rows
    assert f"<b>{0.0421 * 1000 / rows:,.2f} USD</b> per 1,000 accepted rows" in headline
    assert "11.1%" in headline and "caching saved" in headline
    assert "batch API saved" not in headline  # the run was not batched
    cost = page[page.index('<section id="cost">') :]
    assert "<th>cache read</th>" in cost and "12.5%" in cost


def test_a_report_with_no_priced_model_shows_the_share_and_no_dollars(tmp_path: Path) -> None:
    unpriced = {
        "cost_summary": {"per_1k_accepted_usd": None, "accepted": 12, "priced": False,
                         "unpriced_stages": ["amplify", "prefilter"], "cache_read_share": 0.1111,
                         "cache_write_tokens": 0, "cache_saved_usd": None,
                         "batch_saved_usd": None},
    }  # fmt: skip
    page = write_report(make_folder(tmp_path / "o", extra=unpriced)).read_text(encoding="utf-8")
    headline = page[page.index('<section id="headline">') :]
    headline = headline[: headline.index("</section>")]
    assert "No priced model: no dollar figure" in headline and "11.1%" in headline
    assert "USD" not in headline.replace("no dollar figure", "")
    cost = page[page.index('<section id="cost">') :]
    assert "unpriced" in cost[: cost.index("</section>")]
