"""One recipe, any teacher: the shipped recipes on Anthropic's Messages wire (issue 35,
points 1 and 8), against the development server's ``/v1/messages``.

Only ``llm`` keys change. The airline rows are read by LLaMA-Factory's own converter and
have the shape an OpenAI-wire run's rows have; the static prefix was marked, so the run's
usage shows cache writes (the first calls) and cache reads (the rest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from factory.engine.runner import run
from tests.helpers import assert_rows_valid, dev_overrides, lfcompat, recipe

pytestmark = pytest.mark.ray

ANTHROPIC = ["llm.backend=anthropic", "llm.backend_options={client: http}"]
# One request in flight per actor (2 actors): the requests sent before a stage's first
# answer is back all write the prefix (as on Anthropic's API), so at most two do, and every
# later one reads it, however loaded the machine is.
SERIAL = ["llm.concurrency=2", "llm.per_actor_concurrency=1"]


def _columns(out: Path) -> dict[str, str]:
    files = sorted((out / "data").glob("*.parquet"))
    return {name: str(dtype) for name, dtype in pl.read_parquet_schema(files[0]).items()}


def _converted(lf: Any, out: Path) -> list[dict[str, Any]]:
    n, rows = lfcompat.converted(lf, out)
    assert n == len(rows) > 0
    lfcompat.check_rows(lf, rows)
    return rows


def test_the_recipes_run_on_the_anthropic_wire(ray_session, devserver, tmp_path: Path) -> None:
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    server = devserver()
    runs = {}
    for backend, extra in (("anthropic", ANTHROPIC), ("openai", ["llm.backend=aiohttp"])):
        out = tmp_path / f"airline-{backend}"
        cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=6), *SERIAL, *extra)
        assert run(cfg, out, progress=False).totals["accepted"] == 6
        runs[backend] = (cfg, out, json.loads((out / "manifest.json").read_text()))

    cfg, out, manifest = runs["anthropic"]
    _, openai_out, openai_manifest = runs["openai"]
    assert_rows_valid(cfg, pl.read_parquet(sorted((out / "data").glob("*.parquet"))).to_dicts())
    # the same rows for LLaMA-Factory, whichever wire carried the teacher's answers
    assert _columns(out) == _columns(openai_out)
    assert (out / "dataset_info.json").read_text() == (
        openai_out / "dataset_info.json"
    ).read_text().replace("airline-openai", "airline-anthropic")
    rows, openai_rows = _converted(lf, out), _converted(lf, openai_out)
    assert [sorted(r) for r in rows] == [sorted(r) for r in openai_rows]
    assert lfcompat.LOGGER.warnings == []
    # Anthropic caches the marked static prefix: written by the first calls of each stage
    # (at most two: SERIAL), read by the others (41 judge calls, 7 amplification calls);
    # the OpenAI wire never reports a cache write
    for stage in ("prefilter", "amplify"):
        tokens = manifest["by_stage"][stage]["tokens"]
        assert 0 < tokens["cache_write_tokens"] < tokens["cached_tokens"], stage
        assert tokens["cached_tokens"] < tokens["prompt_tokens"], stage
    assert manifest["tokens"]["cached_tokens"] / manifest["tokens"]["prompt_tokens"] > 0.5
    assert "cache_write_tokens" not in openai_manifest["tokens"]

    # a text-action domain's recipe, and an envsim recipe (it calls no LLM: the keys change
    # nothing, and must not break it)
    out = tmp_path / "os"
    cfg = recipe("os.yaml", out, *dev_overrides(server.url, target=4), *SERIAL, *ANTHROPIC)
    assert run(cfg, out, progress=False).totals["accepted"] == 4
    tokens = json.loads((out / "manifest.json").read_text())["tokens"]
    assert tokens["cached_tokens"] > 0 and tokens["cache_write_tokens"] > 0
    _converted(lf, out)

    mix = tmp_path / "mix.yaml"
    mix.write_text("name: tiny\nquotas:\n  - {name: fail, group: Failure, count: 5}\n")
    out = tmp_path / "envsim"
    cfg = recipe(
        "airline-envsim.yaml",
        out,
        f"mixture.path={mix}",
        "envsim.episodes_per_round=20",
        "envsim.max_episodes=40",
        "llm.model=factory-dev",
        f'llm.endpoints=[{{"base_url": "{server.url}"}}]',
        *ANTHROPIC,
    )
    assert run(cfg, out, progress=False).totals["accepted"] == 5
