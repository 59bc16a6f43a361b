from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.core.labels import GROUPS, group_for
from factory.core.mixture import IntSet, Mixture, Quota
from factory.core.selection import Selection, select
from factory.errors import ConfigError
from tests.conftest import ROOT as REPO_ROOT

ROOT = REPO_ROOT
BALANCE2 = ROOT / "pipelines" / "mixtures" / "balance2.yaml"


def step(
    sample_id: str,
    delta: int | None,
    *,
    env: Any = None,
    task: Any = None,
    user: Any = None,
    args: int = 1,
) -> dict[str, Any]:
    """A step sample; ``delta`` ``None`` means a failed call."""
    outcome = "failure" if delta is None else "no_change" if delta == 0 else "change"
    labels = {
        "kind": "step",
        "outcome": outcome,
        "group": group_for(outcome, delta),
        "delta_size": delta or 0,
        "arg_cardinality": args,
        "task_id": task,
        "user_id": user,
        "env_id": env,
    }
    return {"id": sample_id, "labels": labels}


def mix(*quotas: dict[str, Any], name: str = "m") -> Mixture:
    return Mixture.from_dict({"name": name, "quotas": list(quotas)})


def pool(n_per_group: int, n_envs: int = 7) -> list[dict[str, Any]]:
    deltas = {
        "Failure": None,
        "No-Change": 0,
        "Simple": 2,
        "Medium": 4,
        "Difficult": 9,
        "Beyond": 20,
    }
    return [
        step(f"{g}-{i}", deltas[g], env=f"env{i % n_envs}", task=i % 11, user=f"u{i % 5}")
        for g in GROUPS
        for i in range(n_per_group)
    ]


# --- the spec ---------------------------------------------------------------------------------


def test_balance2_is_envsimbench_balance2() -> None:
    m = Mixture.load(BALANCE2)
    assert m.name == "balance2"
    assert [(q.name, q.count) for q in m.quotas] == [
        ("failure", 1000),
        ("no_change", 1000),
        ("simple_change", 2000),
        ("complex_change", 2230),
    ]
    assert m.total == 6230
    by_name = {q.name: q for q in m.quotas}
    for delta, quota in [
        (None, "failure"),
        (0, "no_change"),
        (1, "simple_change"),
        (2, "simple_change"),
        (3, "complex_change"),
        (7, "complex_change"),
        (13, "complex_change"),
        (500, "complex_change"),
    ]:
        labels = step("x", delta)["labels"]
        assert [q.name for q in m.quotas if q.matches(labels)] == [quota]
    assert not by_name["complex_change"].matches(step("x", 2)["labels"])


def test_round_trip_through_dict() -> None:
    m = mix(
        {"name": "a", "count": 3, "group": ["Simple", "Medium"], "description": "d"},
        {"name": "b", "count": 0, "outcome": "refused", "write_calls": {"min": 1}},
        {
            "name": "c",
            "count": 5,
            "group": "Simple",
            "delta": [1, {"min": 3, "max": 4}],
            "arg_cardinality": {"max": 2},
        },
    )
    assert Mixture.from_dict(m.to_dict()) == m
    assert json.loads(json.dumps(m.to_dict())) == m.to_dict()


GOOD_QUOTA: dict[str, Any] = {"name": "q", "count": 1, "group": "Simple"}


@pytest.mark.parametrize(
    ("data", "key_path"),
    [
        ([], ""),
        ({"name": "m", "quotas": [GOOD_QUOTA], "colour": "red"}, "colour"),
        ({"quotas": [GOOD_QUOTA]}, "name"),
        ({"name": "m"}, "quotas"),
        ({"name": "m", "quotas": []}, "quotas"),
        ({"name": "m", "quotas": ["q"]}, "quotas[0]"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "groups": ["Simple"]}]}, "quotas[0].groups"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "count": -1}]}, "quotas[0].count"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "count": True}]}, "quotas[0].count"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "count": 2.5}]}, "quotas[0].count"),
        ({"name": "m", "quotas": [{"name": "q", "group": "Simple"}]}, "quotas[0].count"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "group": "Hard"}]}, "quotas[0].group"),
        (
            {
                "name": "m",
                "quotas": [GOOD_QUOTA, {**GOOD_QUOTA, "name": "r", "group": ["Simple", "Complex"]}],
            },
            "quotas[1].group[1]",
        ),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "group": []}]}, "quotas[0].group"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "outcome": "success"}]}, "quotas[0].outcome"),
        ({"name": "m", "quotas": [{"name": "q", "count": 1, "delta": 1}]}, "quotas[0]"),
        ({"name": "m", "quotas": [GOOD_QUOTA, GOOD_QUOTA]}, "quotas[1].name"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "name": ""}]}, "quotas[0].name"),
        (
            {"name": "m", "quotas": [{**GOOD_QUOTA, "delta": {"min": 3, "max": 1}}]},
            "quotas[0].delta",
        ),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "delta": {"mn": 3}}]}, "quotas[0].delta.mn"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "delta": {"min": -1}}]}, "quotas[0].delta.min"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "delta": [1, "2"]}]}, "quotas[0].delta[1]"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "delta": []}]}, "quotas[0].delta"),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "write_calls": -2}]}, "quotas[0].write_calls"),
        (
            {"name": "m", "quotas": [{**GOOD_QUOTA, "arg_cardinality": {"max": "3"}}]},
            "quotas[0].arg_cardinality.max",
        ),
        ({"name": "m", "quotas": [{**GOOD_QUOTA, "description": 7}]}, "quotas[0].description"),
    ],
)
def test_bad_specs_name_their_key_path(data: Any, key_path: str) -> None:
    with pytest.raises(ConfigError) as info:
        Mixture.from_dict(data)
    assert info.value.args[0].startswith(f"{key_path}: " if key_path else "")
    if key_path:
        # the exact path, not a longer one sharing its prefix
        assert info.value.args[0].split(": ", 1)[0] == key_path


def test_load_reports_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read mixture file"):
        Mixture.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: m\nquotas: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        Mixture.load(bad)


def test_int_sets() -> None:
    s = IntSet.parse([0, {"min": 3, "max": 4}, {"min": 10}], "k")
    assert [v in s for v in (0, 1, 2, 3, 4, 5, 10, 99)] == [
        True,
        False,
        False,
        True,
        True,
        False,
        True,
        True,
    ]
    assert True not in IntSet.parse(1, "k")  # a bool is not a count
    assert None not in s
    assert 1 in IntSet.parse({"max": 1}, "k")
    assert 0 in IntSet.parse({"max": 1}, "k")


def test_delta_selector_never_reads_write_calls() -> None:
    trajectory = {"outcome": "completed", "group": None, "write_calls": 3, "arg_cardinality": 2}
    by_delta = Quota("d", 1, outcomes=("completed",), delta=IntSet.parse({"min": 1}, "k"))
    by_writes = Quota("w", 1, outcomes=("completed",), write_calls=IntSet.parse({"min": 1}, "k"))
    by_group = Quota("g", 1, groups=("Medium",))
    assert not by_delta.matches(trajectory)
    assert by_writes.matches(trajectory)
    assert not by_group.matches(trajectory)


# --- selection --------------------------------------------------------------------------------


def test_exact_quotas_when_enough_samples() -> None:
    m = Mixture.load(BALANCE2)
    small = Mixture.from_dict(
        {"name": "small", "quotas": [{**q.to_dict(), "count": 10} for q in m.quotas]}
    )
    result = select(pool(30), small, seed=1)
    assert result.counts == {q.name: 10 for q in small.quotas}
    assert result.complete and result.shortfall == {}
    assert len(result.ids) == len(set(result.ids)) == 40
    for entry in result.selected:
        quota = next(q for q in small.quotas if q.name == entry["quota"])
        assert quota.matches(entry["labels"])
    assert result.unmatched == 0  # the complex quota spans three groups: all six are covered
    assert result.seen == 180


def test_shortfall_is_reported_and_never_filled_from_other_groups() -> None:
    samples = [step(f"f{i}", None, env=f"e{i}") for i in range(3)]
    samples += [step(f"s{i}", 1, env=f"e{i}") for i in range(100)]
    m = mix(
        {"name": "failure", "count": 10, "group": "Failure"},
        {"name": "simple", "count": 5, "group": "Simple"},
    )
    result = select(samples, m, seed=0)
    assert result.counts == {"failure": 3, "simple": 5}
    assert result.shortfall == {"failure": 7}
    assert not result.complete
    assert {e["labels"]["group"] for e in result.selected if e["quota"] == "failure"} == {"Failure"}
    text = result.report()
    assert "SHORTFALL" in text and "failure 7" in text


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_deterministic_under_any_input_order(seed: int) -> None:
    samples = pool(25)
    m = mix(
        {"name": "a", "count": 17, "group": ["Simple", "Medium"]},
        {"name": "b", "count": 9, "group": "Medium"},
        {"name": "c", "count": 40, "group": "Failure"},
    )
    first = select(samples, m, seed=seed)
    for shuffle_seed in range(3):
        shuffled = samples[:]
        random.Random(shuffle_seed).shuffle(shuffled)
        again = select(iter(shuffled), m, seed=seed)
        assert again.selected == first.selected
        assert again.to_dict() == first.to_dict()


def test_the_seed_changes_the_choice() -> None:
    samples = pool(200)
    m = mix({"name": "simple", "count": 20, "group": "Simple"})
    assert select(samples, m, seed=1).ids != select(samples, m, seed=2).ids


def test_one_per_environment_before_a_second() -> None:
    samples = [step(f"a{i}", 1, env="big") for i in range(50)]
    samples += [step(f"{e}{i}", 1, env=e) for e in "bcde" for i in range(3)]
    m = mix({"name": "simple", "count": 5, "group": "Simple"})
    for seed in range(5):
        picked = select(samples, m, seed=seed).selected
        assert sorted(e["labels"]["env_id"] for e in picked) == ["b", "big", "c", "d", "e"]
    m8 = mix({"name": "simple", "count": 8, "group": "Simple"})
    envs = Counter(e["labels"]["env_id"] for e in select(samples, m8, seed=0).selected)
    assert set(envs) == {"big", "b", "c", "d", "e"}
    assert max(envs.values()) == 2
    result = select(samples, m8, seed=0)
    assert result.distinct["simple"]["env_id"] == 5


def test_task_then_user_are_fallback_coverage_keys() -> None:
    by_task = [step(f"t{i}", 0, task=i % 4) for i in range(40)]
    m = mix({"name": "nc", "count": 4, "group": "No-Change"})
    picked = select(by_task, m, seed=3).selected
    assert sorted(e["labels"]["task_id"] for e in picked) == [0, 1, 2, 3]
    by_user = [step(f"u{i}", 0, user=f"user{i % 3}") for i in range(30)]
    m3 = mix({"name": "nc", "count": 3, "group": "No-Change"})
    picked = select(by_user, m3, seed=3).selected
    assert sorted(e["labels"]["user_id"] for e in picked) == ["user0", "user1", "user2"]


def test_new_tasks_first_within_one_environment() -> None:
    samples = [step(f"x{i}", 2, env="only", task="common") for i in range(30)]
    samples.append(step("rare", 2, env="only", task="rare"))
    m = mix({"name": "s", "count": 2, "group": "Simple"})
    for seed in range(5):
        picked = select(samples, m, seed=seed).selected
        assert sorted(e["labels"]["task_id"] for e in picked) == ["common", "rare"]


def test_excluded_tasks_and_users_are_dropped_and_counted() -> None:
    samples = [step(f"s{i}", 1, task=i % 5, user=f"u{i % 4}") for i in range(40)]
    m = mix({"name": "s", "count": 100, "group": "Simple"})
    result = select(samples, m, seed=0, exclude_task_ids=["1"], exclude_user_ids=["u2", "nobody"])
    chosen = [e["labels"] for e in result.selected]
    assert all(lab["task_id"] != 1 and lab["user_id"] != "u2" for lab in chosen)
    by_task = sum(1 for i in range(40) if i % 5 == 1)
    by_user = sum(1 for i in range(40) if i % 5 != 1 and i % 4 == 2)
    assert result.excluded_by == {"task_id": by_task, "user_id": by_user}
    assert result.excluded == by_task + by_user
    assert result.counts["s"] == 40 - result.excluded
    assert result.shortfall == {"s": 100 - result.counts["s"]}


def test_overlapping_quotas_first_match_that_still_needs_rows() -> None:
    samples = pool(20)
    m = mix(
        {"name": "wide", "count": 5, "group": ["Simple", "Medium"]},
        {"name": "medium", "count": 100, "group": "Medium"},
    )
    result = select(samples, m, seed=4)
    wide_medium = sum(
        1 for e in result.selected if e["quota"] == "wide" and e["labels"]["group"] == "Medium"
    )
    assert result.counts == {"wide": 5, "medium": 20 - wide_medium}
    assert result.available == {"wide": 40, "medium": 20 - wide_medium}
    assert len(set(result.ids)) == len(result.ids)
    assert result.unmatched == 4 * 20  # Failure, No-Change, Difficult, Beyond rows


def test_bad_rows_are_recorded_not_raised() -> None:
    samples: list[Any] = [
        step("ok", 1),
        {"labels": {"group": "Simple"}},
        {"id": 7, "labels": {"group": "Simple"}},
        {"id": "no-labels"},
        {"id": "list-labels", "labels": ["Simple"]},
        {"id": "bad-group", "labels": {"group": "Easy"}},
        {"id": "bad-delta", "labels": {"group": "Simple", "delta_size": "2"}},
        {"id": "bad-env", "labels": {"group": "Simple", "env_id": {"a": 1}}},
        {"id": "bad-kind", "labels": {"group": "Simple", "kind": True}},
        "not even a dict",
    ]
    result = select(samples, mix({"name": "s", "count": 5, "group": "Simple"}), seed=0)
    assert result.ids == ["ok"]
    assert set(result.invalid) == {
        "<row 1>",
        "<row 2>",
        "<row 3>",
        "list-labels",
        "bad-group",
        "bad-delta",
        "bad-env",
        "bad-kind",
        "<row 9>",
    }
    assert "delta_size" in result.invalid["bad-delta"]
    assert result.seen == len(samples)


def test_duplicate_ids_resolve_the_same_way_in_any_order() -> None:
    a = {"id": "dup", "labels": {**step("dup", 1)["labels"], "env_id": "a"}}
    b = {"id": "dup", "labels": {**step("dup", 1)["labels"], "env_id": "b"}}
    m = mix({"name": "s", "count": 5, "group": "Simple"})
    first, second = select([a, b], m, seed=0), select([b, a], m, seed=0)
    assert first.selected == second.selected
    assert first.ids == ["dup"] and first.duplicates == 1
    assert list(first.rows([b, a, b])) == list(first.rows([a, b])) == [a]


def test_rows_second_pass_streams_payloads() -> None:
    def stream() -> Any:
        for sample in pool(10):
            yield {**sample, "payload": "x" * 1000}

    m = mix({"name": "f", "count": 4, "group": "Failure"})
    result = select(stream(), m, seed=9)
    rows = list(result.rows(stream()))
    assert sorted(r["id"] for r in rows) == sorted(result.ids)
    assert all(r["payload"] for r in rows)


def test_custom_key_reads_other_row_shapes() -> None:
    rows = [(f"r{i}", step("", 3)["labels"]) for i in range(6)]
    result = select(
        rows, mix({"name": "m", "count": 2, "group": "Medium"}), seed=0, key=lambda row: row
    )
    assert result.counts == {"m": 2}
    assert len(list(result.rows(rows, key=lambda row: row))) == 2


def test_report_and_summary() -> None:
    result = select(pool(5), Mixture.load(BALANCE2), seed=0)
    text = result.report()
    for name in ("failure", "no_change", "simple_change", "complex_change"):
        assert name in text
    summary = json.loads(json.dumps(result.to_dict()))
    assert summary["counts"] == {
        "failure": 5,
        "no_change": 5,
        "simple_change": 5,
        "complex_change": 15,
    }
    assert summary["shortfall"]["complex_change"] == 2215
    assert isinstance(result, Selection)


# --- properties -------------------------------------------------------------------------------

labels_st = st.fixed_dictionaries(
    {
        "delta": st.one_of(st.none(), st.integers(0, 15)),
        "env": st.one_of(st.none(), st.sampled_from(["e1", "e2", "e3"])),
        "task": st.one_of(st.none(), st.integers(0, 4)),
        "user": st.one_of(st.none(), st.sampled_from(["u1", "u2"])),
    }
)
quota_st = st.fixed_dictionaries(
    {
        "group": st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True),
        "count": st.integers(0, 12),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(labels_st, max_size=60),
    quotas=st.lists(quota_st, min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
    order=st.randoms(use_true_random=False),
)
def test_selection_properties(
    rows: list[dict[str, Any]], quotas: list[dict[str, Any]], seed: int, order: random.Random
) -> None:
    samples = [
        step(f"id{i}", r["delta"], env=r["env"], task=r["task"], user=r["user"])
        for i, r in enumerate(rows)
    ]
    m = mix(*({"name": f"q{n}", **q} for n, q in enumerate(quotas)))
    result = select(samples, m, seed=seed)

    assert len(result.ids) == len(set(result.ids))
    taken: set[str] = set()
    for quota in m.quotas:
        matching = {s["id"] for s in samples if quota.matches(s["labels"])} - taken
        assert result.counts[quota.name] == min(quota.count, len(matching))
        assert result.shortfall.get(quota.name, 0) == quota.count - result.counts[quota.name]
        mine = {e["id"] for e in result.selected if e["quota"] == quota.name}
        assert mine <= matching
        taken |= mine
        # coverage: no environment gives a second sample while another matching one gave none
        envs = Counter(
            e["labels"]["env_id"]
            for e in result.selected
            if e["quota"] == quota.name and e["labels"]["env_id"] is not None
        )
        unused = {s["labels"]["env_id"] for s in samples if s["id"] in matching} - set(envs)
        unused.discard(None)
        if envs and max(envs.values()) > 1:
            assert not unused

    shuffled = samples[:]
    order.shuffle(shuffled)
    assert select(shuffled, m, seed=seed).selected == result.selected


def test_selection_keeps_only_the_known_label_keys() -> None:
    sample = step("a", 1, env="e", task=2)
    sample["labels"]["notes"] = "x" * 10_000
    del sample["labels"]["kind"]
    result = select([sample], mix({"name": "s", "count": 1, "group": "Simple"}), seed=0)
    kept = result.selected[0]["labels"]
    assert "notes" not in kept and "kind" not in kept
    assert kept == {k: v for k, v in sample["labels"].items() if k != "notes"}
    assert list(result.rows([sample])) == [sample]


def test_text_action_quotas_select_by_outcome_and_apps() -> None:
    mixture = Mixture.from_dict(
        {
            "name": "office",
            "quotas": [
                {"name": "gave_up", "outcome": "gave_up", "count": 1},
                {"name": "three_apps", "outcome": ["completed", "error"], "apps": {"min": 3},
                 "count": 1},
                {"name": "narrow", "outcome": "completed", "arg_cardinality": {"max": 1},
                 "count": 1},
            ],
        }
    )  # fmt: skip
    samples = [
        {"id": "a", "labels": {"kind": "trajectory", "outcome": "gave_up", "apps": 1}},
        {"id": "b", "labels": {"kind": "trajectory", "outcome": "error", "apps": 3}},
        {"id": "c", "labels": {"kind": "trajectory", "outcome": "completed", "apps": 2,
                               "arg_cardinality": 1}},
        {"id": "d", "labels": {"kind": "trajectory", "outcome": "completed", "apps": 2,
                               "arg_cardinality": 4}},
    ]  # fmt: skip
    selection = select(samples, mixture, seed=0)
    assert sorted(selection.ids) == ["a", "b", "c"] and not selection.shortfall
    assert Mixture.from_dict(mixture.to_dict()) == mixture


@pytest.mark.parametrize(
    "path", sorted((ROOT / "pipelines" / "mixtures").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_mixtures_load(path: Path) -> None:
    mixture = Mixture.load(path)
    assert mixture.total > 0 and Mixture.from_dict(mixture.to_dict()) == mixture
