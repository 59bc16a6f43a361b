"""End to end on Ray against the development server: the retail recipe, and the mixed
airline + retail recipe with a quota per domain and every row labelled with its domain."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import pytest

from factory.engine.runner import run
from tests.helpers import assert_rows_valid, dev_overrides, read_rows, recipe

pytestmark = pytest.mark.ray


def test_retail_recipe_amplifies_offline(ray_session, devserver, tmp_path: Path) -> None:
    server = devserver(seed=3)
    out = tmp_path / "out"
    cfg = recipe("retail.yaml", out, *dev_overrides(server.url, target=40))
    result = run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert result.exit_code == 0, manifest.get("reasons")
    assert manifest["seeds"]["kept"] == manifest["seeds"]["total"] >= 30
    rows = read_rows(out)
    assert len(rows) == 40 and len({r["id"] for r in rows}) == 40
    assert_rows_valid(cfg, rows)  # the retail tools' schemas and filters/retail.yaml
    tools = {t["name"] for t in json.loads(rows[0]["tools"])}
    assert "exchange_delivered_order_items" in tools and "book_reservation" not in tools
    assert manifest["generated_with_devserver"] is True


def test_mixed_recipe_fills_each_domain_quota_and_labels_rows(
    ray_session, devserver, tmp_path: Path
) -> None:
    server = devserver(seed=4)
    out = tmp_path / "out"
    overrides = [*dev_overrides(server.url, target=30), "parts.0.quota=12", "parts.1.quota=18"]
    cfg = recipe("mixed.yaml", out, *overrides)
    # First under a run-wide call cap that the airline part's judge and calls leave the
    # retail part too little of: one job, one ledger, so retail stops at the cap.
    capped = run(recipe("mixed.yaml", out, *overrides, "amplify.max_calls=80"), out, progress=False)
    assert capped.stopped_by == "max_calls"
    first = json.loads((out / "manifest.json").read_text())
    assert first["calls"]["issued"] <= 80  # every stage's calls of every part, capped once
    assert first["parts"]["airline"]["rows"] == 12
    assert first["parts"]["retail"]["stopped_by"] == "max_calls"
    airline = (out / "parts" / "airline" / "manifest.json").read_bytes()
    # Then without the cap: the finished part is reused as it is, the other resumes.
    result = run(cfg, out, progress=False)
    assert result.exit_code == 0
    assert (out / "parts" / "airline" / "manifest.json").read_bytes() == airline
    rows = read_rows(out)
    by_domain = Counter(json.loads(r["meta"])["domain"] for r in rows)
    assert by_domain == {"airline": 12, "retail": 18}
    for row in rows:  # each row is its own domain's: its tools and its policy
        names = {t["name"] for t in json.loads(row["tools"])}
        domain = json.loads(row["meta"])["domain"]
        assert ("cancel_pending_order" in names) == (domain == "retail")
        assert ("cancel_reservation" in names) == (domain == "airline")
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: v["rows"] for k, v in manifest["parts"].items()} == {"airline": 12, "retail": 18}
    t = manifest["totals"]
    assert t["accepted"] == 30
    parts = [json.loads((out / "parts" / n / "manifest.json").read_text()) for n in by_domain]
    for kind in ("prompt_tokens", "completion_tokens"):  # what every part spent, summed
        assert manifest["tokens"][kind] == sum(p["tokens"][kind] for p in parts) > 0
    assert manifest["stages"]["postprocess"]["accepted"] == 30
    assert t["total"] == t["accepted"] + t["surplus"] + t["rejected"] + t["failed"]
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["factory_mixed"]["file_name"] == "data"
    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), split="train")
    assert ds.num_rows == 30
    # The same command again: every part is done, nothing is called, the dataset is the same.
    requests = server.stats()["requests"]
    again = run(cfg, out, progress=False)
    assert again.totals == result.totals and server.stats()["requests"] == requests
