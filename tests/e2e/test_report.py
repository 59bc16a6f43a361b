"""A real run writes its report and dataset card, the folder still matches its
manifest, the card loads with ``datasets``, and the report opens in a browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.io.runstate import verify_output
from tests.helpers import dev_overrides, recipe
from tests.helpers.browser import assert_readable, chromium_path, open_page
from tests.helpers.reportfolder import make_folder


@pytest.mark.ray
def test_a_run_ends_with_its_report_and_card(ray_session, devserver, tmp_path: Path) -> None:
    from datasets import load_dataset

    from factory.engine.runner import run

    server = devserver(seed=41, defects={"malformed_json": 0.2})
    out = tmp_path / "o"
    result = run(
        recipe("airline.yaml", out, *dev_overrides(server.url, target=30)), out, progress=False
    )
    assert result.exit_code == 0 and result.totals["accepted"] == 30
    report, card = out / "report.html", out / "README.md"
    assert str(report) in result.summary() and str(card) in result.summary()
    verify_output(out)  # the documents are not shards: the manifest still holds
    assert json.loads((out / "run.json").read_text())["status"] == "done"
    manifest = json.loads((out / "manifest.json").read_text())
    timeline = manifest["timeline"]
    assert timeline["columns"][:3] == ["seconds", "total", "accepted"]
    assert timeline["points"][-1][1:3] == [result.totals["total"], 30]  # the end is a point
    page = report.read_text(encoding="utf-8")
    codes = [code for stage in manifest["reasons"].values() for code in stage]
    assert codes and all(code in page for code in codes)  # defects: some rows rejected
    assert 'alt="Rows over time"' in page and 'alt="Cost per stage (USD)"' in page
    ds = load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 30
    assert (out / "llamafactory" / "sft.yaml").is_file()
    if chromium_path():
        check = open_page(report, screenshot=tmp_path / "amplify.png", full_page=True)
        assert len(check.plots) >= 10
        assert_readable(check)
        titles = [s["title"] for s in check.sections]
        assert "Training fit (LLaMA-Factory)" in titles and "More from the manifest" in titles
        assert "diversity" in {m["title"] for m in check.more}


# A run of millions of tokens, paid in full (cost and paid one series), rows arriving
# after 9.8 s of start-up: what drew a "1e6" corner label, a line hidden under its twin
# and a throughput of zero then one step (issue 39).
_LONG_START = {
    "tokens": {"prompt_tokens": 3_584_204, "completion_tokens": 397_840},
    "by_stage": {
        "prefilter": {"tokens": {"prompt_tokens": 255_491, "completion_tokens": 1_541},
                      "cost_usd": 0.0939},
        "amplify": {"tokens": {"prompt_tokens": 3_328_713, "completion_tokens": 396_299},
                    "cost_usd": 4.9027},
    },
    "wall_time_s": 10.6,
    "timeline": {"columns": ["seconds", "total", "accepted", "cost_usd", "paid_usd"],
                 "points": [[9.6, 0, 0, 0.09, 0.09], [9.8, 0, 0, 0.12, 0.12],
                            [10.1, 9, 7, 2.0, 2.0], [10.6, 15, 12, 4.9966, 4.9966]]},
    "diversity": {"tools_per_row": {"rows": 12, "histogram": {"1": 4, "2": 8}}},
}  # fmt: skip


def test_the_report_opens_in_a_browser_with_no_error_and_every_plot_drawn(
    tmp_path: Path,
) -> None:
    from factory.io.report import write_report

    chromium_path()  # skips, saying why, without a browser
    report = write_report(make_folder(tmp_path / "o", extra=_LONG_START))
    check = open_page(report, screenshot=tmp_path / "shot.png", full_page=True)
    assert check.title.startswith("factory run report")
    assert check.requests == []  # nothing fetched: the file is the whole report
    assert len(check.plots) >= 11
    assert_readable(check)  # no hidden twin line, no legend on a plot, no 1e6
    drawn = {d["alt"]: d for d in check.drawn}
    assert drawn["Cost over time"]["lines"] == 1  # cost = paid: one line, named so
    assert drawn["Rows over time"]["lines"] == 2  # total and accepted differ: both
    assert drawn["Tokens per row (bins of 2)"]["legends"] == 1  # cutoff_len, off the bars
    sections = {s["title"]: s["text"] for s in check.sections}
    # the headline, as a person sees it: first, the cost per 1,000 accepted rows, then
    # the cache-read share and what caching saved (issue 35, point 4)
    assert check.sections[0]["title"] == "Cost per 1,000 accepted rows"
    headline = sections["Cost per 1,000 accepted rows"]
    assert headline.startswith("3.51 USD per 1,000 accepted rows")  # 0.0421 USD / 12 rows
    assert "read from the provider's cache\t11.1%" in headline and "caching saved" in headline
    assert "cache read" in sections["Tokens and cost per stage"]
    assert "calls issued" in sections["Funnel"] and "rounds" not in sections["Funnel"]
    assert "the first 9.8 s are start-up" in sections["Throughput and cost over time"]
    assert (tmp_path / "shot.png").stat().st_size > 10_000
