"""What an output folder holds and whether a run may continue it (``factory.io.runstate``)."""

from __future__ import annotations

import pytest

from factory.config import load_recipe
from factory.errors import ConfigError
from factory.io.runstate import changed_keys, prepare_output
from tests.conftest import ROOT


def test_changed_keys_ignore_resumable_settings() -> None:
    old = {
        "amplify": {"target": 10, "seed": 0, "max_cost_usd": 1},
        "llm": {"model": "a"},
        "ray": {"actors": 2},
    }
    new = {
        "amplify": {"target": 50, "seed": 1, "max_cost_usd": 9},
        "llm": {"model": "b"},
        "ray": {"actors": 4},
    }
    assert changed_keys(old, new) == ["amplify.seed", "llm.model"]


def test_prepare_output_resume_refuse_fresh_done(tmp_path) -> None:
    cfg = load_recipe(ROOT / "pipelines/airline-seeds.yaml")
    out = tmp_path / "o"
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "new"
    (out / "data").mkdir()
    (out / "data" / "part-00000.parquet").write_bytes(b"x")
    (out / "cache").mkdir()
    (out / "cache" / "w.jsonl").write_text("{}")
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "resume"
    assert not (out / "data").exists() and (out / "cache" / "w.jsonl").exists()
    other = load_recipe(ROOT / "pipelines/airline-seeds.yaml", ["output.reasoning=strip"])
    with pytest.raises(ConfigError) as info:
        prepare_output(other, out, fresh=False, retry_failed=False)
    assert info.value.key_path == "output.reasoning" and "--fresh" in str(info.value)
    assert prepare_output(other, out, fresh=True, retry_failed=False) == "new"
    assert (out / "cache" / "w.jsonl").exists()  # paid for: --fresh keeps it
    assert prepare_output(other, out, fresh=True, retry_failed=False, drop_cache=True) == "new"
    assert not (out / "cache").exists()
