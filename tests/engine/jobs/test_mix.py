"""A recipe with parts (several domains, one dataset): its checks and how a part's recipe is
derived. The end-to-end run on Ray is in ``tests/e2e/test_retail.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.engine.jobs.mix import label_rows, part_recipe
from factory.errors import ConfigError
from factory.recipe import load_recipe
from tests.conftest import ROOT

MIXED = ROOT / "pipelines" / "mixed.yaml"


def test_each_part_is_an_amplify_recipe_of_its_own_domain(tmp_path: Path) -> None:
    cfg = load_recipe(MIXED, ["amplify.max_cost_usd=100", "amplify.max_calls=1000"])
    parts = [part_recipe(cfg, i, tmp_path) for i in range(2)]
    assert [p.domain.name for p in parts] == ["airline", "retail"]
    assert [p.amplify.target for p in parts if p.amplify] == [27000, 63000]
    assert [p.output.dir for p in parts] == [
        str(tmp_path / "parts" / n) for n in ("airline", "retail")
    ]
    assert {p.cache.path for p in parts} == {str(tmp_path / "cache")}  # one shared cache
    assert all(p.parts is None and p.llm == cfg.llm for p in parts)
    assert parts[1].resolve(parts[1].domain.tools or "") == ROOT / "prompts/retail/tools.json"
    # A later part gets what the earlier ones left of the run-wide caps.
    later = part_recipe(cfg, 1, tmp_path, {"cost_usd": 30.0, "tokens": 0, "calls": 400})
    assert later.amplify is not None
    assert later.amplify.max_cost_usd == pytest.approx(70.0) and later.amplify.max_calls == 600
    assert cfg.amplify is not None and cfg.amplify.max_cost_usd == 100  # the recipe is untouched


@pytest.mark.parametrize(
    ("overrides", "key_path", "words"),
    [
        (["amplify.target=5"], "amplify.target", "sum of the parts' quotas"),
        (["seeds={path: x.jsonl}"], "seeds", "in each part"),
        (["parts.1.domain.name=airline"], "parts.1", "used twice"),
        (["parts.1.seeds={}"], "parts.1.seeds", "seeds.path"),
        (["pipeline=curate"], "parts", "amplify pipeline"),
        (["parts.0.quota=0"], "parts.0.quota", ""),
        (["parts.0.label=a/b"], "parts.0.label", ""),
    ],
)
def test_a_bad_mixed_recipe_names_the_key(overrides: list[str], key_path: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(MIXED, overrides)
    assert info.value.key_path == key_path and words in str(info.value)


def test_rows_are_labelled_with_their_part() -> None:
    rows = [{"id": "a", "meta": json.dumps({"seed_id": "s1"})}, {"id": "b", "meta": None}]
    labelled = list(label_rows(iter(rows), "retail"))
    assert [json.loads(r["meta"]) for r in labelled] == [
        {"seed_id": "s1", "domain": "retail"},
        {"domain": "retail"},
    ]
    assert rows[0]["meta"] == json.dumps({"seed_id": "s1"})  # the input rows are not changed


def test_the_dry_run_plans_every_part() -> None:
    from factory.engine.plan import make_plan

    plan = make_plan(load_recipe(MIXED), with_examples=False)
    assert (plan.seeds_read, plan.seeds_valid) == (76, 76)  # 41 airline + 35 retail seeds
    calls = {s.stage: s.calls for s in plan.stages}
    assert calls == {
        "prefilter/airline": 41,
        "amplify/airline": 30000,  # 27,000 rows at the expected yield of 0.9
        "prefilter/retail": 35,
        "amplify/retail": 70000,
    }


def test_a_mixed_run_resumes_with_other_quotas_but_not_other_parts() -> None:
    from factory.io.runstate import changed_keys

    def dump(*overrides: str) -> dict[str, object]:
        return load_recipe(MIXED, list(overrides)).model_dump(mode="json")

    before = dump()
    more = dump("parts.0.quota=30000", "amplify.target=93000")
    assert changed_keys(before, more) == []  # raising a quota extends the run
    other = dump("parts.1.seeds.path=../seeds/other/*.jsonl")
    assert changed_keys(before, other) == ["parts.1.seeds.path"]
