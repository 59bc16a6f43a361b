"""LLaMA-Factory's own converter and formatter accept every row the factory writes.

Runs the real ``SharegptDatasetConverter`` (via ``align_dataset``'s per-row
converter) and ``FunctionFormatter`` from the installed ``llamafactory``
package over the curated seeds and the 199 valid tau-bench trajectories, and
applies its supervised-preprocess filter (odd prompt length, one response).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from factory.core.mixture import Mixture
from factory.engine.runner import run
from tests.conftest import ROOT
from tests.helpers import assert_rows_valid, dev_overrides, lfcompat, read_rows, recipe

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("name", ["airline-seeds.yaml", "os-seeds.yaml"])
def test_curated_seeds_load_with_zero_drops(ray_session, tmp_path: Path, name: str) -> None:
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    result = run(recipe(name, tmp_path), tmp_path, progress=False)
    n, rows = lfcompat.converted(lf, tmp_path)
    assert n == len(rows) == result.totals["total"] > 30  # every seed, none dropped
    lfcompat.check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []


# Content defects the devserver applies in a text-action grammar's terms (an unknown action,
# malformed arguments, a missing observation) next to broken JSON and transport errors.
TEXT_DEFECTS = {
    "malformed_json": 0.05,
    "unknown_tool": 0.1,
    "wrong_arg_type": 0.1,
    "missing_observation": 0.05,
    "rate_limit": 0.1,
}


@pytest.mark.parametrize(
    ("name", "mixture"),
    [("os.yaml", None), ("office-compose.yaml", "office-balance2.yaml")],
)
def test_amplified_text_action_rows_load_with_zero_drops(
    ray_session, devserver, tmp_path: Path, name: str, mixture: str | None
) -> None:
    """Amplify a text-action pack against the devserver (the judge included), then read the
    rows with LLaMA-Factory's converter: the agent's text format, no tools column, nothing
    dropped. The composition run selects its rows by a Balance2-style mixture of labels."""
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    server = devserver(defects=TEXT_DEFECTS, retry_after_s=0.05, seed=11)
    out = tmp_path / "out"
    extra = []
    if mixture is not None:  # the shipped mix, scaled down to this run's size
        mix = Mixture.load(ROOT / "pipelines" / "mixtures" / mixture).scaled(0.001)
        (tmp_path / "mix.yaml").write_text(yaml.safe_dump(mix.to_dict()))
        extra = [f"mixture={{path: {tmp_path / 'mix.yaml'}}}"]
    cfg = recipe(name, out, *dev_overrides(server.url, target=36), *extra)
    result = run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    info = json.loads((out / "dataset_info.json").read_text())
    assert "tools" not in next(iter(info.values()))["columns"]
    assert result.totals["accepted"] == 36
    reasons = manifest["reasons"]["postprocess"]
    assert {"unknown_action", "malformed_action"} <= set(reasons), reasons
    # the judge saw every seed and kept them all (they are valid in the grammar)
    assert manifest["by_stage"]["prefilter"]["tokens"]["prompt_tokens"] > 0
    assert manifest["seeds"]["kept"] == manifest["seeds"]["total"] >= 30
    n, rows = lfcompat.converted(lf, out)
    assert n == len(rows) == (36 if mixture is None else manifest["mixture"]["written"]) > 0
    lfcompat.check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []
    written = read_rows(out)
    assert_rows_valid(cfg, written)
    labels = [json.loads(r["meta"])["labels"] for r in written]
    assert all(not r["tools"] and "# Actions" in r["system"] for r in written)
    if mixture is not None:
        assert all(x["apps"] >= 2 for x in labels)
        selected = manifest["mixture"]["selected"]
        assert selected and sum(selected.values()) == len(written)


@pytest.mark.parametrize("reasoning", ["keep", "strip"])
def test_taubench_trajectories_load_with_zero_drops(
    ray_session, taubench_dir: Path, tmp_path: Path, reasoning: str
) -> None:
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    cfg = recipe(
        "airline-seeds.yaml",
        tmp_path,
        f"seeds.path={taubench_dir / 'gpt-4o-airline.json'}",
        f"output.reasoning={reasoning}",
    )
    result = run(cfg, tmp_path, progress=False)
    n, rows = lfcompat.converted(lf, tmp_path)
    assert n == result.totals["accepted"] >= 190
    lfcompat.check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []
    thinks = sum("<think>" in m["content"] for r in rows for m in r["_prompt"] + r["_response"])
    assert (thinks > 0) == (reasoning == "keep")
