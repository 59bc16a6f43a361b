"""Post-processing does each thing once (issue 9), with outputs byte-identical to before."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from factory.bench import postprocess_completions
from factory.core.schema import fast_check
from factory.engine.stages.base import make_row
from factory.engine.stages.export import output_fields, training_row
from factory.recipe import load_recipe
from tests.conftest import ROOT as REPO_ROOT
from tests.helpers import postprocess_stage

ROOT = REPO_ROOT
COLUMNS = ("status", "stage", "reason", "message", "id", "output", "labels", "raw", "grounding")
# sha256 of every output row for 300 devserver completions (30% with a defect), computed
# with the code of main before issue 9 (commit d283016), which normalised and rendered
# every trajectory twice; the same completions must give the same bytes.
GOLDEN = {
    (): "0e3091cebfa8b086ff27b1d5938852f81bf309e278acab1bc660118e772a8514",
    ("output.reasoning=strip", "amplify.system_prompt_format=hermes"): (
        "c68accad9874d963c9f604ae9044431a13e756f375f203bb1c91da7723f23f23"
    ),
}


@pytest.fixture(scope="module")
def completions() -> list[str]:
    return postprocess_completions(
        300, recipe=ROOT / "pipelines/airline.yaml", seed=9, defect_rate=0.3
    )


@pytest.mark.parametrize("overrides", list(GOLDEN), ids=["json-keep", "hermes-strip"])
def test_outputs_are_those_of_main(completions: list[str], overrides: tuple[str, ...]) -> None:
    stage = postprocess_stage(load_recipe(ROOT / "pipelines/airline.yaml", list(overrides)))
    digest = hashlib.sha256()
    statuses = set()
    for i, text in enumerate(completions):
        row = make_row(completion=text, seed_id=f"s{i % 41}", source=f"s#{i}", call_index=i)
        out = stage.run_one(row)
        statuses.add(out["status"])
        if out.get("output"):  # the training row as one JSON text, as main wrote it
            out["output"] = json.dumps(training_row(out), ensure_ascii=False)
        digest.update(json.dumps([out.get(k) for k in COLUMNS]).encode())
    assert statuses == {"ok", "rejected"}
    assert digest.hexdigest() == GOLDEN[overrides]


def test_a_training_row_travels_with_its_shared_columns_apart_and_comes_back_whole() -> None:
    """``output`` holds the row's own columns; the system prompt and tools travel beside
    it, one object per distinct text in a process, so a reply of many rows carries each
    text once (pickle writes an object it has seen as a reference)."""
    import pickle

    def row(i: int, system: str) -> dict[str, Any]:
        return {
            "conversations": [{"from": "human", "value": f'Zürich "now" {i}\n'}],
            "system": system,
            "tools": json.dumps([{"name": "t"}] * 50),
            "id": f"id{i}",
            "meta": "{}",
        }

    policy = "Policy \u2014 é " * 400
    rows = [output_fields(row(i, "".join(policy))) for i in range(20)]  # 20 equal copies
    assert all(r["system"] is rows[0]["system"] and r["tools"] is rows[0]["tools"] for r in rows)
    assert json.loads(rows[0]["output"])["system"] is None
    for i, r in enumerate(rows):
        back = training_row(r)
        assert back == row(i, policy) and list(back) == list(row(i, policy))  # order too
    assert len(pickle.dumps(rows)) < 3 * len(policy.encode())  # it crossed once, not 20 times
    other = output_fields(row(0, "other"))
    assert training_row(other)["system"] == "other"


def _tools() -> list[dict[str, Any]]:
    return json.loads((ROOT / "prompts/airline/tools.json").read_text())


def _instances(completions: list[str]) -> list[tuple[str, Any]]:
    """(tool, arguments) of every call in the completions, plus hand-made edge cases."""
    found = []
    for text in completions:
        try:
            messages = json.loads(text).get("messages", [])
        except (ValueError, AttributeError):
            continue
        for m in messages:
            for c in m.get("tool_calls") or []:
                found.append((c.get("name"), c.get("arguments")))
    edge: list[Any] = [{}, [], None, 1.0, True, "x", {"user_id": 1}, {"user_id": True}]
    names = [t.get("function", t)["name"] for t in _tools()]
    return found + [(n, e) for n in names for e in edge]


def test_fast_check_accepts_only_what_jsonschema_accepts(completions: list[str]) -> None:
    schemas = {t.get("function", t)["name"]: t.get("function", t)["parameters"] for t in _tools()}
    checks = {name: fast_check(schema) for name, schema in schemas.items()}
    assert all(check is not None for check in checks.values())
    accepted = 0
    for name, arguments in _instances(completions):
        if name not in schemas:
            continue
        valid = Draft202012Validator(schemas[name]).is_valid(arguments)
        fast = checks[name](arguments)  # type: ignore[misc]
        assert not fast or valid, (name, arguments)
        accepted += fast
    assert accepted > 100  # the fast path is taken, not just safe


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 2},
        {"anyOf": [{"type": "string"}]},
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"},
        {"type": "object", "patternProperties": {"^x": {}}},
        {"enum": [1, 2]},
    ],
)
def test_fast_check_declines_keywords_it_does_not_cover(schema: dict[str, Any]) -> None:
    assert fast_check(schema) is None


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ({"type": "integer"}, 1.0, False),  # jsonschema says valid: left to it
        ({"type": "integer"}, True, False),
        ({"type": "number", "minimum": 0}, -1, False),
        ({"type": "string", "pattern": "^A$(?!\\n)"}, "A\n", False),
        ({"type": "string", "pattern": "^A$(?!\\n)"}, "A", True),
        ({"type": "object", "additionalProperties": False}, {"a": 1}, False),
        ({"type": "array", "items": {"type": "string"}, "minItems": 1}, ["a"], True),
        ({"type": "array", "items": {"type": "string"}, "minItems": 1}, [], False),
    ],
)
def test_fast_check_cases(schema: dict[str, Any], value: Any, expected: bool) -> None:
    check = fast_check(schema)
    assert check is not None and check(value) is expected
    if expected:
        assert Draft202012Validator(schema).is_valid(value)


# --- text-action domains -------------------------------------------------------------------------
def _completion(*pairs: tuple[str, str]) -> str:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in pairs]})


def test_a_text_action_completion_becomes_a_row_in_the_agents_format() -> None:
    stage = postprocess_stage(load_recipe(ROOT / "pipelines/os.yaml"))
    sloppy = "Think: count them.\nAct:bash\n```sh\nls /srv | wc -l"
    text = _completion(
        ("user", "How many entries does /srv have?"),
        ("assistant", sloppy),
        ("tool", "The output of the OS:\n\n7"),
        ("assistant", "Think: seven.\n\nAct: answer(7)"),
    )
    out = stage.run_one(make_row(completion=text, seed_id="s", source="s#0", call_index=0))
    assert out["status"] == "ok", out.get("message")
    row = training_row(out)
    assert row["tools"] == "" and "# Actions" in row["system"]
    assert row["system"].startswith("# OS agent policy")
    assert [m["from"] for m in row["conversations"]] == ["human", "gpt", "human", "gpt"]
    assert row["conversations"][1]["value"].endswith("Act: bash\n\n```bash\nls /srv | wc -l\n```")
    meta = json.loads(row["meta"])
    assert meta["labels"]["outcome"] == "completed" and meta["labels"]["apps"] == 1
    assert meta["repairs"] == [
        "messages[1]: fence_language",
        "messages[1]: close_fence",
        "messages[1]: action_whitespace",
    ]


def test_a_broken_text_action_completion_is_rejected_with_its_code() -> None:
    stage = postprocess_stage(load_recipe(ROOT / "pipelines/webshop.yaml"))
    text = _completion(
        ("user", "WebShop [SEP] Instruction: [SEP] a red mug [SEP] [Search]"),
        ("assistant", "Thought:\nsearch\n\nAction:\nscroll[down]"),
        ("tool", "page"),
        ("assistant", "Thought:\nbuy\n\nAction:\nclick[Buy Now]"),
    )
    out = stage.run_one(make_row(completion=text, seed_id="s", source="s#0", call_index=0))
    assert (out["status"], out["reason"]) == ("rejected", "unknown_action")
    assert out["raw"] == text


def test_a_pack_without_a_policy_keeps_each_seeds_system_prompt_sent_as_prompts_only() -> None:
    """Issue 34: the post-processing spec carries the kept seeds' system prompts (only for a
    pack without a policy), not their records; each row keeps its own seed's."""
    import dataclasses

    from factory.core.formats import parse_record
    from factory.engine.settings import postprocess_settings
    from factory.engine.stages.postprocess import PostprocessStage, seed_systems
    from factory.envs.pack import load_domain

    cfg = load_recipe(ROOT / "pipelines/airline.yaml")
    line = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[0]
    seed = parse_record(json.loads(line), source="s:0")
    seed.system = "You are the airline's own agent, as this seed says."
    domain = load_domain(cfg.domain)
    assert seed_systems(domain, {seed.id: seed.to_json()}) == {}  # a policy: it rules
    bare = dataclasses.replace(domain, policy="")
    systems = seed_systems(bare, {seed.id: seed.to_json()})
    assert systems == {seed.id: seed.system}
    stage = PostprocessStage(postprocess_settings(cfg), bare, systems)
    completion = postprocess_completions(1, recipe=ROOT / "pipelines/airline.yaml", seed=3)[0]
    row = make_row(id="c0", completion=completion, seed_id=seed.id, source="s:0#0")
    out = stage.run_one(row)
    assert out["status"] == "ok", out.get("message")
    assert seed.system in training_row(out)["system"]
