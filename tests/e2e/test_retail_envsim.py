"""The envsim job on the retail world, offline: world -> steps -> a small mixture -> alpaca.

The retail pack (``prompts/retail/tools.json``) lands with another branch; this test
writes the retail tools from the plug-in's own specs (``default_tools``) beside a
recipe of its own, so it needs nothing but the plug-in.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from factory.devserver.simulate import read_simulation, simulate_call
from factory.engine.runner import run
from factory.envs.retail.sampler import default_tools
from factory.envsim.simulator import parse_prediction
from factory.evaluate import main as evaluate_main
from factory.recipe import load_recipe
from tests.helpers import check_alpaca

pytestmark = pytest.mark.ray

QUOTAS = {"failure": 40, "no_change": 40, "simple_change": 20, "complex_change": 40}


def _recipe(tmp: Path, out: Path) -> Path:
    (tmp / "tools.json").write_text(json.dumps(default_tools()), encoding="utf-8")
    (tmp / "mix.yaml").write_text(
        "name: retail-small\nquotas:\n"
        "  - {name: failure, group: Failure, count: 40}\n"
        "  - {name: no_change, group: No-Change, count: 40}\n"
        "  - {name: simple_change, group: Simple, count: 20}\n"
        "  - {name: complex_change, group: [Medium, Difficult, Beyond], count: 40}\n",
        encoding="utf-8",
    )
    recipe = tmp / "retail-envsim.yaml"
    recipe.write_text(
        "name: retail-envsim-test\npipeline: envsim\n"
        "domain: {name: retail, tools: tools.json}\n"
        "envsim: {world_seed: 1, world_sizes: {n_users: 100, n_orders: 250, n_products: 20},"
        " seed: 0, episodes_per_round: 150, max_episodes: 600, with_code: true}\n"
        "mixture: {path: mix.yaml, seed: 0}\n"
        f"output: {{dir: {out}, dataset_name: retail_envsim_test, shard_rows: 100}}\n"
        "ray: {actors: 1, num_cpus: 0.5}\n",
        encoding="utf-8",
    )
    return recipe


def test_retail_envsim_fills_its_quotas_with_exact_targets(
    ray_session, devserver, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cfg = load_recipe(_recipe(tmp_path, out), [])
    result = run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mixture"]["selected"] == QUOTAS
    assert manifest["mixture"]["shortfall"] == {}
    assert result.totals["accepted"] == sum(QUOTAS.values())
    rows = check_alpaca(out)
    assert len(rows) == sum(QUOTAS.values())
    groups = Counter(json.loads(r["meta"])["labels"]["group"] for r in rows)
    assert groups == {"Failure": 40, "No-Change": 40, "Simple": 20, "Medium": 40}
    for row in rows:
        target = parse_prediction(row["output"])
        state, name, args = read_simulation(row["input"])  # type: ignore[misc]
        assert set(state) == {"users", "orders", "products"}
        assert simulate_call(state, name, args) == target  # the target is the world's answer
        assert "def " in row["instruction"]  # with_code: the tool's source is shown
    # factory.evaluate scores the job's own candidates: a perfect simulator gets them all.
    report_dir = tmp_path / "eval"
    argv = ["--samples", str(out / "candidates"), "--base-url", devserver().url]
    argv += ["--model", "factory-dev", "--limit", "60", "--out", str(report_dir)]
    assert evaluate_main(argv) == 0
    overall = json.loads((report_dir / "evaluation.json").read_text())["overall"]
    assert overall["n"] == overall["feedback_match"] == overall["config_match"] == 60
