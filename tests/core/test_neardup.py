"""Near-duplicate removal (issue 13): views, signatures, the index, the collector, across runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from factory.core.formats.completion import parse_output, render_output
from factory.core.neardup import NearDupIndex, NearDupParams, signature_bytes, view_shingles
from factory.core.trajectory import Trajectory, Turn
from factory.devserver import simulate
from factory.engine.collect import Collector
from factory.engine.stages.base import make_row
from factory.errors import ConfigError
from factory.io.writer import Manifest
from tests.helpers import AIRLINE_SEEDS, collect_rows

PARAMS = NearDupParams()


def renamed(traj: Trajectory, seed: int) -> Trajectory:
    """What the devserver answers for ``traj``: same structure, other names, ids, places."""
    ref = simulate.reference_from_block(json.dumps(render_output(traj)))
    assert ref is not None
    return parse_output(json.dumps(simulate.amplify(ref, random.Random(seed))))


def test_views_differ_and_fold_digits() -> None:
    t = AIRLINE_SEEDS[0]
    user, tools = view_shingles(t, "user", 2), view_shingles(t, "tools", 2)
    assert user and tools and not set(user) & set(tools)
    assert set(view_shingles(t, "both", 2)) == set(user) | set(tools)
    a = Trajectory(turns=[Turn("user", "flight on May 22nd id 4711")])
    b = Trajectory(turns=[Turn("user", "flight on May 23nd id 9033")])
    assert view_shingles(a, "user", 2) == view_shingles(b, "user", 2)
    assert "u:id 0000" in view_shingles(a, "user", 2)


def test_renamed_copies_are_caught_and_distinct_seeds_are_not() -> None:
    index = NearDupIndex(PARAMS)
    for i, seed in enumerate(AIRLINE_SEEDS):  # every authored seed is distinct: all kept
        assert index.check(f"seed{i}", signature_bytes(seed, PARAMS)) is None, i
    for i, seed in enumerate(AIRLINE_SEEDS):
        issue = index.check(f"copy{i}", signature_bytes(renamed(seed, i), PARAMS))
        assert issue is not None and issue.code == "near_duplicate", i
        assert issue.path == f"seed{i}" and f"seed{i}" in issue.message
    assert len(index) == len(AIRLINE_SEEDS)


def test_the_earliest_kept_row_is_named() -> None:
    index = NearDupIndex(PARAMS)
    sig = signature_bytes(AIRLINE_SEEDS[3], PARAMS)
    assert index.check("first", sig) is None
    index.add("second", sig)  # even when several indexed rows match, the earliest is named
    issue = index.check("third", signature_bytes(renamed(AIRLINE_SEEDS[3], 7), PARAMS))
    assert issue is not None and issue.path == "first"


def test_index_round_trip_and_refuses_other_parameters(tmp_path: Path) -> None:
    index = NearDupIndex(PARAMS)
    for i, seed in enumerate(AIRLINE_SEEDS[:10]):
        index.check(f"r{i}", signature_bytes(seed, PARAMS))
    path = tmp_path / "neardup.index"
    index.save(path)
    later = NearDupIndex(PARAMS)
    assert later.load_into(path) == 10 and later.loaded == 10
    issue = later.check("new", signature_bytes(renamed(AIRLINE_SEEDS[4], 1), PARAMS))
    assert issue is not None and issue.path == "r4"
    assert later.check("other", signature_bytes(AIRLINE_SEEDS[20], PARAMS)) is None
    with pytest.raises(ConfigError, match="do not compare"):
        NearDupIndex(NearDupParams(ngram=3)).load_into(path)
    (tmp_path / "bad").write_bytes(b"nope")
    with pytest.raises(ConfigError, match="not a near-duplicate index"):
        NearDupIndex(PARAMS).load_into(tmp_path / "bad")


def _row(traj: Trajectory, rid: str, seed: str) -> dict:
    out = {"conversations": [], "system": "", "tools": "", "id": rid, "meta": "{}"}
    return make_row(
        id=rid,
        status="ok",
        output=json.dumps(out),
        seed_id=seed,
        minhash=signature_bytes(traj, PARAMS),
        labels=json.dumps({"outcome": "completed"}),
    )


def _collect(out: Path, rows: list[dict], index: NearDupIndex) -> tuple[list[str], dict]:
    c = Collector(out, Manifest("r", "h"), dataset_name="d", neardup=index)
    kinds = collect_rows(out, c, [dict(r) for r in rows])
    return kinds, json.loads((out / "manifest.json").read_text())


def test_collector_rejects_near_duplicates_deterministically_and_across_runs(
    tmp_path: Path,
) -> None:
    rows = [_row(AIRLINE_SEEDS[i], f"a{i}", f"s{i}") for i in range(5)]
    rows += [_row(renamed(AIRLINE_SEEDS[i], 10 + i), f"b{i}", f"s{i}") for i in (1, 3)]
    kinds, manifest = _collect(tmp_path / "one", rows, NearDupIndex(PARAMS))
    assert kinds == ["accepted"] * 5 + ["rejected"] * 2
    assert manifest["reasons"]["neardup"] == {"near_duplicate": 2}
    nd = manifest["near_duplicates"]
    assert nd["rejected"] == 2 and nd["index_rows"] == 5 and nd["view"] == "user"
    again, _ = _collect(tmp_path / "two", rows, NearDupIndex(PARAMS))  # a resume replays
    assert again == kinds
    # A second run loading the first run's index adds nothing the first one has.
    later = NearDupIndex(PARAMS)
    later.load_into(tmp_path / "one" / "neardup.index")
    new = [_row(renamed(AIRLINE_SEEDS[i], 30 + i), f"c{i}", f"s{i}") for i in range(4)]
    new.append(_row(AIRLINE_SEEDS[9], "c9", "s9"))
    kinds, manifest = _collect(tmp_path / "three", new, later)
    assert kinds == ["rejected"] * 4 + ["accepted"]
    assert manifest["near_duplicates"]["loaded_from_earlier_runs"] == 5


def test_devserver_repeat_is_a_share_within_bounds() -> None:
    from factory.devserver import DevServerConfig

    assert DevServerConfig(repeat=0.3).repeat == 0.3
    with pytest.raises(ConfigError, match="within"):
        DevServerConfig(repeat=1.5)
