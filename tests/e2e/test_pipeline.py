"""End to end on Ray: curate the shipped seeds, amplify against development servers."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import datasets
import pytest

from factory.core.export import normalize, to_sharegpt
from factory.core.formats import parse_record
from factory.engine.plan import make_plan
from factory.engine.runner import run
from factory.io.readers import iter_records
from tests.conftest import ROOT
from tests.helpers import assert_rows_valid, dev_overrides, read_jsonl, read_rows, recipe

pytestmark = pytest.mark.ray
SEEDS = ROOT / "seeds" / "airline" / "seeds.jsonl"


def test_curate_round_trip_seed_to_parquet(ray_session, tmp_path: Path) -> None:
    cfg = recipe("airline-seeds.yaml", tmp_path)
    result = run(cfg, tmp_path, progress=False)
    seeds = [r for r in iter_records(SEEDS)]
    assert result.totals["accepted"] == len(seeds) == result.totals["total"]
    rows = {r["id"]: r for r in read_rows(tmp_path)}
    for raw in seeds:
        traj = parse_record(raw.record, source=f"{raw.source}:{raw.index}")
        expected = to_sharegpt(normalize(traj), reasoning="keep")
        got = rows[traj.id]
        assert got["conversations"] == expected["conversations"]
        assert got["system"] == expected["system"] and got["tools"] == expected["tools"]
    # Both loaders LLaMA-Factory users reach for read the shards as they are.
    ds = datasets.load_dataset("parquet", data_dir=str(tmp_path / "data"), split="train")
    assert ds.num_rows == len(seeds)
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["factory_airline_seeds"]["file_name"] == "data"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["totals"]["total"] == sum(
        manifest["totals"][k] for k in ("accepted", "surplus", "rejected", "failed")
    )
    assert not list(tmp_path.glob(".tmp/*")), "no temporary file may be left behind"


def test_corrupted_seed_file_rejects_bad_rows_and_keeps_good_ones(
    ray_session, tmp_path: Path
) -> None:
    seeds_dir = tmp_path / "seeds"
    seeds_dir.mkdir()
    good = SEEDS.read_bytes().splitlines()[:5]
    first = json.loads(good[0])
    bad_call = dict(first)
    convs = [dict(m) for m in first["conversations"]]
    i = next(k for k, m in enumerate(convs) if m["from"] == "function_call")
    convs[i]["value"] = '{"name": "get_user_details", "arguments": {"user_id": '  # cut mid-value
    bad_call["conversations"] = convs
    lines = [
        *good,
        b'{"conversations": [{"from": "human", "value": "hi"',  # truncated record
        b"\xff\xfe not utf-8 \x80",
        b'{"conversations": "not a list"}',
        b"[1, 2, 3]",
        json.dumps(bad_call).encode(),
    ]
    (seeds_dir / "mixed.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    cfg = recipe("airline-seeds.yaml", tmp_path / "out", f"seeds.path={seeds_dir}/*.jsonl")
    result = run(cfg, tmp_path / "out", progress=False)
    assert result.totals == {"total": 10, "accepted": 5, "surplus": 0, "rejected": 5, "failed": 0}
    rejects = read_jsonl(tmp_path / "out" / "rejects")
    reasons = Counter(r["reason"] for r in rejects)
    assert reasons == Counter(
        {
            "invalid_json": 1,
            "unreadable_bytes": 1,
            "bad_field_type": 1,
            "not_an_object": 1,
            "malformed_arguments": 1,
        }
    ), reasons
    assert all(r.get("raw") and r.get("message") for r in rejects)


@pytest.fixture()
def seed_subset(tmp_path: Path) -> Path:
    path = tmp_path / "seeds.jsonl"
    shutil.copy(SEEDS, path)
    return path


# Rates high enough that every kind shows up in any ~100-call run, whatever the prompts'
# wording (the draws are seeded by the request body): a call fails for good after two
# transport defects in a row, 0.35^2 = 12% of calls (at the former 0.15 a 100-call run had
# no failed call one time in ten, and a change of prompt wording drew such a run).
DEFECTS = {
    "malformed_json": 0.08,
    "unknown_tool": 0.1,
    "wrong_arg_type": 0.1,
    "missing_observation": 0.05,
    "rate_limit": 0.2,
    "server_error": 0.15,
}


def test_amplify_with_defects_accounts_for_every_call(ray_session, devserver, tmp_path) -> None:
    server = devserver(defects=DEFECTS, retry_after_s=0.05, seed=1)
    out = tmp_path / "out"
    cfg = recipe(
        "airline.yaml", out, *dev_overrides(server.url, target=80), "llm.retry.max_attempts=2"
    )
    result = run(cfg, out, progress=False)
    t = result.totals
    manifest = json.loads((out / "manifest.json").read_text())
    assert t["accepted"] == 80
    assert t["accepted"] + t["surplus"] + t["rejected"] + t["failed"] == t["total"]
    assert manifest["calls"]["issued"] == t["total"]
    assert t["rejected"] > 0 and t["failed"] > 0, "the injected defects must show up"
    reasons = manifest["reasons"]
    assert {"unknown_tool", "wrong_type"} <= set(reasons["postprocess"])
    rows = read_rows(out)
    assert len(rows) == 80 and len({r["id"] for r in rows}) == 80
    assert_rows_valid(cfg, rows)
    failed = read_jsonl(out / "failed")
    assert len(failed) == t["failed"] and all(f["reason"].startswith("llm_") for f in failed)
    assert all(r.get("raw") for r in read_jsonl(out / "rejects") if r["stage"] == "postprocess")
    assert manifest["generated_with_devserver"] is True


def test_the_same_recipe_and_cache_write_the_same_shards_byte_for_byte(
    ray_session, devserver, tmp_path
) -> None:
    """Rows arrive in whatever order the calls race (a heavy-tailed server), are used in
    call order, so a second run answered from the first one's cache writes the same
    dataset: every shard byte for byte, and no answer the first run paid for is asked for
    again. (How many calls beyond the target's prefix go out depends on timing: on a busy
    machine the second run may send a few calls the first never issued; they are
    surplus, and never in the dataset.)"""
    log = tmp_path / "requests.jsonl"
    content_defects = {"malformed_json": 0.1, "unknown_tool": 0.1, "wrong_arg_type": 0.1}
    server = devserver(
        seed=6,
        defects=content_defects,
        latency="lognormal",
        latency_ms=30.0,
        latency_p99_ratio=10.0,
        request_log=str(log),
    )
    shared = (f"cache.path={tmp_path / 'cache'}", "output.shard_rows=16")
    first, second = tmp_path / "first", tmp_path / "second"
    a = run(recipe("airline.yaml", first, *dev_overrides(server.url, target=60), *shared), first)
    first_lines = log.read_text().splitlines()
    asked = {json.loads(line)["request_id"] for line in first_lines}
    b = run(recipe("airline.yaml", second, *dev_overrides(server.url, target=60), *shared), second)
    assert a.totals["accepted"] == b.totals["accepted"] == 60 and a.totals["rejected"] > 0
    lines = log.read_text().splitlines()
    again = [json.loads(line)["request_id"] for line in lines[len(first_lines) :]]
    assert not set(again) & asked  # nothing the first run paid for is requested again
    shards = sorted(p.relative_to(first) for p in first.glob("data/*.parquet"))
    assert len(shards) == 4 and shards == sorted(
        p.relative_to(second) for p in second.glob("data/*.parquet")
    )
    for shard in shards:
        assert (first / shard).read_bytes() == (second / shard).read_bytes(), shard
    assert len(read_rows(first)) == 60


def test_amplify_without_defects_hits_target_exactly(ray_session, devserver, tmp_path) -> None:
    server = devserver(seed=2)
    out = tmp_path / "out"
    cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=120))
    plan = make_plan(cfg, with_examples=False)
    result = run(cfg, out, progress=False)
    rows = read_rows(out)
    assert len(rows) == 120 and len({r["id"] for r in rows}) == 120
    assert result.totals["failed"] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    # The dry-run plan is within 15% of what the run reports (calls and tokens).
    amp = next(s for s in plan.stages if s.stage == "amplify")
    issued = manifest["calls"]["issued"]
    assert abs(amp.calls - issued) / issued <= 0.15
    pre = next(s for s in plan.stages if s.stage == "prefilter")
    real_prompt = manifest["tokens"]["prompt_tokens"]
    planned_prompt = amp.input_tokens * issued / amp.calls + pre.input_tokens
    assert abs(planned_prompt - real_prompt) / real_prompt <= 0.15
    # The static prompt prefix is shared by every call and reported.
    assert manifest["prompt_cache"]["static_prefix_share"] > 0.5


def test_pool_survives_a_dead_member(ray_session, devserver, tmp_path) -> None:
    a, b = devserver(seed=3), devserver(seed=4)
    dying = devserver(seed=5, fail_after=15)
    out = tmp_path / "out"
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(a.url, b.url, dying.url, target=90),
        "llm.retry.max_attempts=4",
    )
    result = run(cfg, out, progress=False)
    assert result.totals["accepted"] == 90
    assert result.totals["failed"] == 0
    assert dying.stats()["requests"] <= 16


@pytest.mark.parametrize("mode", ["verify", "ground"])
def test_grounded_amplification(ray_session, devserver, tmp_path, mode: str) -> None:
    server = devserver(seed=6, wrong_observation=0.3)
    out = tmp_path / "out"
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server.url, target=40),
        f"amplify.grounding={{mode: {mode}}}",
        "prefilter.enabled=false",
    )
    result = run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    g = manifest["grounding"]
    assert result.totals["accepted"] == 40
    assert g["trajectories"] == result.totals["total"] - result.totals["failed"]
    if mode == "verify":
        assert manifest["reasons"]["postprocess"]["contradicts_executor"] > 0
        assert g["observations_replaced"] == 0
    else:
        assert "contradicts_executor" not in manifest["reasons"].get("postprocess", {})
        assert g["observations_replaced"] > 0
    rows = read_rows(out)
    assert_rows_valid(cfg, rows)
    for row in rows:
        meta = json.loads(row["meta"])
        assert meta["grounding"]["fidelity"] == 1.0 or mode == "ground"
        assert isinstance(meta["labels"]["delta_size"], int) and "write_calls" not in meta["labels"]
    # The prompts showed the world: every accepted trajectory is about the scenario's user.
    assert all(json.loads(r["meta"])["grounding"]["user_id"] for r in rows)


def test_trajectory_mixture_on_amplified_output(ray_session, devserver, tmp_path) -> None:
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "name: outcomes\nquotas:\n"
        "  - {name: completed, outcome: completed, count: 10}\n"
        "  - {name: transferred, outcome: transferred, count: 4}\n"
        "  - {name: impossible, outcome: error, count: 3}\n"
    )
    server = devserver(seed=7)
    out = tmp_path / "out"
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server.url, target=60),
        f"mixture={{path: {mix}}}",
        "prefilter.enabled=false",
    )
    run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    mixture = manifest["mixture"]
    assert mixture["selected"]["completed"] == 10 and mixture["selected"]["transferred"] == 4
    assert mixture["shortfall"] == {"impossible": 3}  # reported, not filled from other groups
    rows = read_rows(out)
    assert len(rows) == 14 == mixture["written"]
    outcomes = Counter(json.loads(r["meta"])["labels"]["outcome"] for r in rows)
    assert outcomes == Counter({"completed": 10, "transferred": 4})
    assert all("write_calls" in json.loads(r["meta"])["labels"] for r in rows)
    assert len(read_rows(out, "candidates")) == 60
    # the manifest's diversity describes the dataset (the selection), not the candidates
    diversity = manifest["diversity"]
    assert diversity["rows"] == 14 and diversity["candidates"] == 60
    assert diversity["labels"]["outcome"] == {"completed": 10, "transferred": 4}
    assert sum(diversity["tool_calls"].values()) == sum(
        1 for r in rows for m in r["conversations"] if m["from"] == "function_call"
    )
