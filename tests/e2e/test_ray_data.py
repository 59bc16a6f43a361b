"""``llm.backend: ray_data`` end to end: Ray Data LLM's HTTP processor makes the judge's
and the amplification calls of a real run against the development server.

Rows reach the target, the manifest counts every call's tokens and cost per stage (the
judge and the synthesis stage share one gateway, so one Ray Data execution), and a rerun
into a new folder with the same response cache sends nothing and writes the same shards.
"""

from __future__ import annotations

import json
from pathlib import Path

from factory.engine.runner import run
from tests.helpers import dev_overrides, read_rows, recipe

RAY_DATA = [
    "llm.backend=ray_data",
    "llm.backend_options={processor: http, batch_size: 1, replicas: 1}",
    "llm.concurrency=16",
    "llm.per_actor_concurrency=8",
    "prices.factory-dev={input_per_mtok: 1.25, cached_input_per_mtok: 0.125, "
    "output_per_mtok: 10.0}",
]


def test_ray_data_http_processor_run_counts_every_call_and_a_rerun_pays_nothing(
    ray_session, devserver, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(seed=3, latency_ms=20, request_log=str(log))
    shared = [f"cache.path={tmp_path / 'cache'}", *RAY_DATA]
    first, second = tmp_path / "first", tmp_path / "second"

    a = run(recipe("airline.yaml", first, *dev_overrides(server.url, target=12), *shared), first)
    manifest = json.loads((first / "manifest.json").read_text())
    assert a.totals["accepted"] == 12 and a.error is None
    t = a.totals
    assert t["accepted"] + t["surplus"] + t["rejected"] + t["failed"] == t["total"]
    rows = read_rows(first)
    assert len(rows) == 12 and all(r["conversations"] for r in rows)
    asked = len(log.read_text().splitlines())
    by_stage = manifest["by_stage"]
    assert set(by_stage) == {"prefilter", "amplify"}
    for stage in by_stage.values():
        assert stage["calls"] > 0 and stage["tokens"]["completion_tokens"] > 0
        assert stage["cost_usd"] > 0
    assert sum(s["calls"] for s in by_stage.values()) == asked  # one request per call
    assert manifest["cost_usd"] == round(sum(s["cost_usd"] for s in by_stage.values()), 6)

    b = run(recipe("airline.yaml", second, *dev_overrides(server.url, target=12), *shared), second)
    again = json.loads((second / "manifest.json").read_text())
    assert b.totals["accepted"] == 12
    assert len(log.read_text().splitlines()) == asked  # every answer from the cache
    assert again["cost_usd_paid_this_run"] == 0
    for shard in sorted(first.glob("data/*.parquet")):
        assert (second / "data" / shard.name).read_bytes() == shard.read_bytes(), shard.name
