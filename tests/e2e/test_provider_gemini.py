"""One recipe, any teacher: the shipped recipes run against Gemini's wire (the development
server's generateContent and cachedContents) with only ``llm`` keys changed, and the rows
LLaMA-Factory loads have the shape an OpenAI-wire run writes (issue 35, point 8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.engine.runner import run
from tests.helpers import check_alpaca, dev_overrides, lfcompat, read_rows, recipe

pytestmark = pytest.mark.ray

GEMINI = [
    "llm.backend=gemini",
    "llm.backend_options={explicit_cache: on, cache_storage_per_mtok_hour: 1.0}",
]


def _shape(out: Path) -> tuple[Any, set[str], set[str]]:
    info = json.loads((out / "dataset_info.json").read_text())
    rows = read_rows(out)
    roles = {t["from"] for r in rows for t in r["conversations"]}
    return next(iter(info.values())), {k for r in rows for k in r}, roles


def test_recipes_run_on_gemini_with_only_llm_keys_changed(
    ray_session: Any, devserver: Any, tmp_path: Path
) -> None:
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    log = tmp_path / "requests.jsonl"
    server = devserver(request_log=str(log), seed=3)
    small = dev_overrides(server.url, target=4)
    # airline through Gemini, and the same recipe through the OpenAI wire for the shape
    outs = {}
    for name, extra in (("gemini", GEMINI), ("openai", [])):
        out = outs[name] = tmp_path / f"airline-{name}"
        result = run(recipe("airline.yaml", out, *small, *extra), out, progress=False)
        assert result.totals["accepted"] == 4
    n, rows = lfcompat.converted(lf, outs["gemini"])
    assert n == len(rows) == 4
    lfcompat.check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []
    assert _shape(outs["gemini"]) == _shape(outs["openai"])
    manifest = json.loads((outs["gemini"] / "manifest.json").read_text())
    tokens = manifest["tokens"]
    assert 0 < tokens["cached_tokens"] <= tokens["prompt_tokens"]
    events = [json.loads(x) for x in log.read_text().splitlines()]
    made = [e for e in events if e.get("kind") == "gemini_cache_create"]
    assert made and len(made) == len([e for e in events if e.get("kind") == "gemini_cache_delete"])
    # a text-action recipe and the offline simulator recipe, with the same llm keys
    out = tmp_path / "os"
    result = run(recipe("os.yaml", out, *small, *GEMINI), out, progress=False)
    assert result.totals["accepted"] == 4
    n, rows = lfcompat.converted(lf, out)
    assert n == 4
    lfcompat.check_rows(lf, rows)
    mix = tmp_path / "m.yaml"
    mix.write_text("name: tiny\nquotas:\n  - {name: fail, group: Failure, count: 5}\n")
    out = tmp_path / "envsim"
    cfg = recipe(
        "airline-envsim.yaml",
        out,
        f"mixture.path={mix}",
        "envsim.episodes_per_round=20",
        "envsim.max_episodes=20",
        *GEMINI,
        "llm.model=gemini-2.5-flash",
        f'llm.endpoints=[{{"base_url": "{server.url}"}}]',
    )
    result = run(cfg, out, progress=False)
    assert result.totals["accepted"] == 5
    check_alpaca(out)
