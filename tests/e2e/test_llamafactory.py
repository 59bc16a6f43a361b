"""LLaMA-Factory's own converter and formatter accept every row the factory writes.

Runs the real ``SharegptDatasetConverter`` (via ``align_dataset``'s per-row
converter) and ``FunctionFormatter`` from the installed ``llamafactory``
package over the curated seeds and the 199 valid tau-bench trajectories, and
applies its supervised-preprocess filter (odd prompt length, one response).
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from factory.engine.runner import run
from tests.helpers import lfcompat, recipe

pytestmark = pytest.mark.ray


def converted(lf: lfcompat.LF, out: Path) -> tuple[int, list[dict]]:
    info = json.loads((out / "dataset_info.json").read_text())
    ((_, entry),) = info.items()
    attr = lfcompat.DatasetAttr.from_info(entry)
    ds = datasets.load_dataset("parquet", data_dir=str(out / entry["file_name"]), split="train")
    conv = lf.converter.get_dataset_converter(attr.formatting, attr, lfcompat.DataArgs())
    rows = [conv(example) for example in ds]
    return ds.num_rows, rows


def check_rows(lf: lfcompat.LF, rows: list[dict]) -> None:
    fmt = lf.formatter.FunctionFormatter(slots=["{{content}}"], tool_format="default")
    tools_util = lf.tool_utils.get_tool_utils("default")
    for row in rows:
        prompt, response = row["_prompt"], row["_response"]
        # LLaMA-Factory's supervised preprocess drops anything else ("Dropped invalid example").
        assert len(prompt) % 2 == 1 and len(response) == 1, row
        for message in [*prompt, *response]:
            if message["role"] == "function":
                fmt.apply(content=message["content"], thought_words=("<think>", "</think>"))
        if row["_tools"]:
            assert tools_util.tool_formatter(json.loads(row["_tools"]))


def test_curated_seeds_load_with_zero_drops(ray_session, tmp_path: Path) -> None:
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    run(recipe("airline-seeds.yaml", tmp_path), tmp_path, progress=False)
    n, rows = converted(lf, tmp_path)
    assert n == len(rows) > 30
    check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []


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
    n, rows = converted(lf, tmp_path)
    assert n == result.totals["accepted"] >= 190
    check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []
    thinks = sum("<think>" in m["content"] for r in rows for m in r["_prompt"] + r["_response"])
    assert (thinks > 0) == (reasoning == "keep")
