"""The simulator-data pipeline end to end, offline: world -> steps -> Balance2 -> alpaca."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from factory.devserver.simulate import read_simulation, simulate_call
from factory.engine.runner import run
from factory.envsim.simulator import parse_prediction
from factory.evaluate import main as evaluate_main
from tests.helpers import check_alpaca, recipe
from tests.helpers.browser import assert_readable, chromium_path, open_page

pytestmark = pytest.mark.ray


def test_balance2_exact_quotas_loadable_and_exact_labels(ray_session, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(recipe("airline-envsim.yaml", out), out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mixture"]["selected"] == {
        "failure": 1000,
        "no_change": 1000,
        "simple_change": 2000,
        "complex_change": 2230,
    }
    assert manifest["mixture"]["shortfall"] == {}
    t = result.totals
    assert t["accepted"] == 6230
    assert t["total"] == t["accepted"] + t["surplus"] + t["rejected"] + t["failed"]
    rows = check_alpaca(out)
    assert len(rows) == 6230 and len({r["id"] for r in rows}) == 6230
    groups = Counter(json.loads(r["meta"])["labels"]["group"] for r in rows)
    assert groups["Failure"] == 1000 and groups["No-Change"] == 1000
    assert groups["Simple"] == 2000
    assert groups["Medium"] + groups["Difficult"] + groups["Beyond"] == 2230
    assert groups["Difficult"] > 0
    # The training target is exact: re-executing the call of the input on the state of the
    # input gives the target's feedback and exactly its config changes.
    for row in rows[::53]:
        target = parse_prediction(row["output"])
        state, name, args = read_simulation(row["input"])
        assert simulate_call(state, name, args) == target
        labels = json.loads(row["meta"])["labels"]
        assert len(target["config_changes"]) == labels["delta_size"]
    # The manifest's diversity describes what data/ holds, counted from its rows here.
    div = manifest["diversity"]
    metas = [json.loads(r["meta"]) for r in rows]
    assert div["unit"] == "step" and div["rows"] == len(rows)
    assert div["tool_calls"] == dict(sorted(Counter(m["tool"] for m in metas).items()))
    for key in ("group", "delta_size", "arg_cardinality"):
        assert div["labels"][key] == {
            str(k): n for k, n in sorted(Counter(str(m["labels"][key]) for m in metas).items())
        }
    per_task = Counter(m["labels"]["task_id"] for m in metas)
    assert div["per_task"]["max"] == max(per_task.values())
    assert div["per_task"]["tasks"] - div["per_task"]["tasks_with_nothing"] == len(per_task)
    assert 0 < div["distinct_calls"] <= len(rows) and 0 < div["distinct_states"] <= len(rows)
    # The report, as a browser draws it: tools never called are named against the domain's
    # list (step samples carry none), and every section is readable (issue 25).
    never = sorted(set(manifest["domain"]["tools"]) - set(div["tool_calls"]))
    page = (out / "report.html").read_text()
    assert "Never called:</b> " + ", ".join(f"<code>{t}</code>" for t in never) in page
    assert f"{len(div['tool_calls'])} of {len(manifest['domain']['tools'])} tools called" in page
    if chromium_path():
        check = open_page(out / "report.html", screenshot=tmp_path / "envsim.png", full_page=True)
        assert_readable(check)
    sft = yaml.safe_load((out / "llamafactory" / "sft.yaml").read_text())
    assert sft["dataset"] == "factory_airline_envsim" and sft["cutoff_len"] % 256 == 0


def test_small_mixture_reports_shortfall_instead_of_borrowing(
    ray_session, devserver, tmp_path: Path
) -> None:
    mix = tmp_path / "m.yaml"
    mix.write_text(
        "name: tiny\nquotas:\n"
        "  - {name: fail, group: Failure, count: 20}\n"
        "  - {name: beyond, group: Beyond, count: 5}\n"
    )
    out = tmp_path / "out"
    cfg = recipe(
        "airline-envsim.yaml",
        out,
        f"mixture.path={mix}",
        "envsim.episodes_per_round=40",
        "envsim.max_episodes=80",
    )
    result = run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mixture"]["selected"]["fail"] == 20
    assert manifest["mixture"]["shortfall"] == {"beyond": 5}
    assert result.totals["accepted"] == 20
    assert manifest["episodes"] == 80
    check_alpaca(out)
    # The candidates are step samples the evaluator reads as they are; a perfect simulator
    # scores 100%, one that drops a change misses Config Match exactly where Δ is non-empty.
    for drop, cm in ((0.0, 1.0), (1.0, None)):
        server = devserver(sim_drop_change=drop)
        report_dir = tmp_path / f"eval-{drop}"
        code = evaluate_main(
            [
                "--samples",
                str(out / "candidates"),
                "--base-url",
                server.url,
                "--model",
                "factory-dev",
                "--limit",
                "150",
                "--out",
                str(report_dir),
            ]
        )
        assert code == 0
        report = json.loads((report_dir / "evaluation.json").read_text())
        overall = report["overall"]
        assert overall["feedback_match"] == overall["n"] == 150
        if cm is not None:
            assert overall["config_match"] == overall["n"]
        else:  # misses exactly the samples with a state change
            changed = sum(
                v["n"] for k, v in report["by_group"].items() if k not in ("Failure", "No-Change")
            )
            assert changed > 0 and overall["config_match"] == overall["n"] - changed
