"""The retail domain pack: tool specs, argument rules and authored seeds agree.

Like the airline pack (``tests/envs/test_pack.py``), the pack is data, so its
failures are silent: a spec that no longer accepts tau-bench's calls, a rule that
never fires, a seed that skips identification or writes without a yes. These tests
read the files as a consumer would; one runs every seed through the engine's own
seed checks (``SeedCheckStage``) with the recipe ``pipelines/retail.yaml``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from factory.engine.pipeline import seed_rows_local
from factory.engine.stages.base import OK
from factory.recipe import load_recipe
from tests.conftest import ROOT, SHARED
from tests.helpers import seed_check_stage

TAUBENCH = SHARED / "data" / "taubench-retail"
TOOLS_PATH = ROOT / "prompts" / "retail" / "tools.json"
POLICY_PATH = ROOT / "prompts" / "retail" / "policy.md"
RULES_PATH = ROOT / "filters" / "retail.yaml"
SEEDS_PATH = ROOT / "seeds" / "retail" / "seeds.jsonl"
RECIPE = ROOT / "pipelines" / "retail.yaml"

KINDS = {
    "calculate": "generic",
    "cancel_pending_order": "write",
    "exchange_delivered_order_items": "write",
    "find_user_id_by_email": "read",
    "find_user_id_by_name_zip": "read",
    "get_order_details": "read",
    "get_product_details": "read",
    "get_user_details": "read",
    "list_all_product_types": "read",
    "modify_pending_order_address": "write",
    "modify_pending_order_items": "write",
    "modify_pending_order_payment": "write",
    "modify_user_address": "write",
    "return_delivered_order_items": "write",
    "think": "generic",
    "transfer_to_human_agents": "generic",
}
# What the policy forbids, each shown refused at least once.
REFUSALS = {
    "identify_user_id_is_not_enough",
    "refuse_other_user",
    "cancel_refused_processed",
    "cancel_refused_item_modified",
    "modify_order_address_refused_delivered",
    "modify_payment_refused_gift_card_balance",
    "modify_items_refused_other_product",
    "modify_items_refused_unavailable",
    "return_refused_other_card",
    "return_refused_not_delivered",
    "exchange_refused_unavailable",
    "exchange_refused_already_requested",
    "exchange_refused_pending_modify_instead",
}
# The status an order must have for each write, and the status it has afterwards.
STATUS_RULES = {
    "cancel_pending_order": ("pending", "cancelled"),
    "modify_pending_order_address": ("pending", "pending"),
    "modify_pending_order_payment": ("pending", "pending"),
    "modify_pending_order_items": ("pending", "pending (item modified)"),
    "return_delivered_order_items": ("delivered", "return requested"),
    "exchange_delivered_order_items": ("delivered", "exchange requested"),
}
IDENTIFY = {"find_user_id_by_email", "find_user_id_by_name_zip"}

TOOLS: list[dict[str, Any]] = json.loads(TOOLS_PATH.read_text(encoding="utf-8"))
SPECS = {t["name"]: t for t in TOOLS}
RULES_DOC: dict[str, Any] = yaml.safe_load(RULES_PATH.read_text(encoding="utf-8"))
RULES: list[dict[str, Any]] = RULES_DOC["rules"]
SEEDS: list[dict[str, Any]] = [
    json.loads(line) for line in SEEDS_PATH.read_text(encoding="utf-8").splitlines() if line
]
SEED_IDS = [f"{i}-{s['metadata']['scenario']}" for i, s in enumerate(SEEDS)]


def values_at(arguments: Any, path: str) -> list[Any]:
    """Values at a rule path; ``key[]`` walks every list item, a missing key yields nothing."""
    current = [arguments]
    for segment in path.split("."):
        many = segment.endswith("[]")
        key = segment[:-2] if many else segment
        step: list[Any] = []
        for value in current:
            if isinstance(value, dict) and key in value:
                inner = value[key]
                if not many:
                    step.append(inner)
                elif isinstance(inner, list):
                    step.extend(inner)
        current = step
    return current


def rule_failures(tool: str, arguments: dict[str, Any]) -> list[str]:
    return [
        rule["id"]
        for rule in RULES
        if tool in rule["tools"]
        and any(
            not Draft202012Validator(rule["schema"]).is_valid(v)
            for v in values_at(arguments, rule["argument"])
        )
    ]


def steps(seed: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(index, call, observation text) for every function_call of a seed."""
    conv = seed["conversations"]
    for i, turn in enumerate(conv):
        if turn["from"] == "function_call":
            yield i, json.loads(turn["value"]), conv[i + 1]["value"]


# --- tools.json ---------------------------------------------------------------------------
def test_tools_are_the_sixteen_retail_tools_with_kinds() -> None:
    assert [t["name"] for t in TOOLS] == sorted(KINDS)
    for tool in TOOLS:
        assert set(tool) == {"name", "description", "parameters", "x-kind"}, tool["name"]
        assert tool["x-kind"] == KINDS[tool["name"]]
        Draft202012Validator.check_schema(tool["parameters"])
        assert tool["parameters"]["type"] == "object"
        assert tool["parameters"].get("additionalProperties") is False, tool["name"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("get_order_details", {"order_id": "#W2378156", "user_id": "mia_ortiz_4821"}),
        ("cancel_pending_order", {"order_id": "#W2378156", "reason": "found it cheaper"}),
        ("cancel_pending_order", {"order_id": "#W2378156"}),
        (
            "return_delivered_order_items",
            {"order_id": "#W5193047", "item_ids": [], "payment_method_id": "gift_card_1"},
        ),
        ("modify_pending_order_payment", {"order_id": 2378156, "payment_method_id": "paypal_1"}),
    ],
)
def test_tool_schemas_reject_malformed_calls(tool: str, arguments: dict[str, Any]) -> None:
    assert not Draft202012Validator(SPECS[tool]["parameters"]).is_valid(arguments)


def _shape(schema: dict[str, Any]) -> Any:
    """What a caller must match: types, enums, required lists and property names, recursively."""
    out: dict[str, Any] = {"type": schema.get("type"), "enum": schema.get("enum")}
    if "properties" in schema:
        out["properties"] = {k: _shape(v) for k, v in schema["properties"].items()}
        out["required"] = sorted(schema.get("required", []))
    if "items" in schema:
        out["items"] = _shape(schema["items"])
    return out


def _reference() -> Path:
    if not TAUBENCH.is_dir():
        pytest.skip(f"tau-bench retail reference data not found at {TAUBENCH}")
    return TAUBENCH


@pytest.mark.shared
def test_tools_match_taubench_signatures_in_own_words() -> None:
    raw = json.loads((_reference() / "tools.json").read_text(encoding="utf-8"))
    reference = {t["function"]["name"]: t["function"] for t in raw}
    assert set(reference) == set(SPECS)
    for name, ref in reference.items():
        assert _shape(SPECS[name]["parameters"]) == _shape(ref["parameters"]), name
        assert SPECS[name]["description"] != ref["description"], name
    wiki = (_reference() / "wiki.md").read_text(encoding="utf-8")
    policy = POLICY_PATH.read_text(encoding="utf-8")
    copied = [line for line in wiki.splitlines() if len(line) > 40 and line in policy]
    assert copied == []  # the policy is written in our own words


@pytest.mark.shared
def test_every_taubench_replay_call_passes_schemas_and_rules() -> None:
    runs = json.loads((_reference() / "replays-train.json").read_text(encoding="utf-8"))
    calls = [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for run in runs
        for msg in run["traj"]
        for call in msg.get("tool_calls") or []
    ]
    assert len(calls) == 4073
    validators = {name: Draft202012Validator(SPECS[name]["parameters"]) for name in SPECS}
    bad = [
        (name, args)
        for name, args in calls
        if not validators[name].is_valid(args) or rule_failures(name, args)
    ]
    assert bad == []


# --- filters/retail.yaml --------------------------------------------------------------------
RULE_CASES = {
    "order_id_format": (["#W2378156"], ["W2378156", "#W237815", "#w2378156", "#W2378156\n"]),
    "user_id_format": (["mia_ortiz_4821"], ["Mia_Ortiz_4821", "mia_ortiz", "mia ortiz 4821"]),
    "product_id_format": (["4173920658"], ["417392065", "41739206581", "T-Shirt"]),
    "item_id_format": (["7350218846"], ["735021884", "item_7350218846", 7350218846]),
    "payment_method_id_format": (
        ["credit_card_3917264", "paypal_6208413", "gift_card_4832716"],
        ["certificate_1", "visa_7731", "gift_card_", "paypal"],
    ),
    "email_format": (["mia.ortiz4821@example.com"], ["mia.ortiz4821", "a@b", "a b@c.com"]),
    "lookup_zip_format": (["43215", "04101"], ["4321", "43215-1234", "ABCDE"]),
    "address_line_present": (["412 Maple Avenue"], ["", "   "]),
}


def test_rules_file_is_well_formed_and_every_rule_can_fire() -> None:
    assert RULES_DOC["domain"] == "retail"
    assert RULES_DOC["limits"] == {"max_parallel_calls": 1}
    ids = [r["id"] for r in RULES]
    assert len(ids) == len(set(ids))
    for rule in RULES:
        Draft202012Validator.check_schema(rule["schema"])
        for tool in rule["tools"]:
            schema: Any = SPECS[tool]["parameters"]
            for segment in rule["argument"].split("."):  # a typo would never fire
                schema = schema["properties"][segment.removesuffix("[]")]
                if segment.endswith("[]"):
                    schema = schema["items"]


@pytest.mark.parametrize("rule_id", sorted(RULE_CASES))
def test_rule_accepts_good_and_rejects_bad_values(rule_id: str) -> None:
    rule = next(r for r in RULES if r["id"] == rule_id)
    check = Draft202012Validator(rule["schema"])
    good, bad = RULE_CASES[rule_id]
    assert [v for v in good if not check.is_valid(v)] == []
    assert [v for v in bad if check.is_valid(v)] == []


# --- seeds ----------------------------------------------------------------------------------
def test_seed_file_shape_and_coverage() -> None:
    assert len(SEEDS) >= 30
    public = [{k: v for k, v in t.items() if k != "x-kind"} for t in TOOLS]
    policy = POLICY_PATH.read_text(encoding="utf-8")
    for seed in SEEDS:
        assert set(seed) == {"conversations", "tools", "system", "metadata"}
        assert json.loads(seed["tools"]) == public
        assert seed["system"] == policy
    called = {call["name"] for seed in SEEDS for _i, call, _o in steps(seed)}
    assert called == set(KINDS)  # every tool appears in some seed
    scenarios = [s["metadata"]["scenario"] for s in SEEDS]
    assert len(scenarios) == len(set(scenarios))
    assert REFUSALS - set(scenarios) == set()


def test_every_seed_passes_the_engines_seed_checks() -> None:
    cfg = load_recipe(RECIPE)
    stage = seed_check_stage(cfg)  # a data-only domain: the recipe names its files
    rows = [stage.process(row) for row in seed_rows_local(cfg.seeds)]
    assert len(rows) == len(SEEDS)
    assert [
        (r["source"], r.get("reason"), r.get("message")) for r in rows if r["status"] != OK
    ] == []


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_seed_follows_the_policy(seed: dict[str, Any]) -> None:
    conv = seed["conversations"]
    assert conv[0]["from"] == "human" and conv[-1]["from"] == "gpt"
    identified = False
    orders: dict[str, dict[str, Any]] = {}  # the last observation of each order
    for i, call, obs in steps(seed):
        name, args = call["name"], call["arguments"]
        assert Draft202012Validator(SPECS[name]["parameters"]).is_valid(args), (i, name)
        assert rule_failures(name, args) == [], (i, name)
        if name in IDENTIFY and not obs.startswith("Error"):
            identified = True
        elif name not in IDENTIFY and name != "transfer_to_human_agents":
            assert identified, f"turn {i}: {name} before the user was identified"
        if KINDS[name] == "write":
            last_user = next(t["value"] for t in reversed(conv[:i]) if t["from"] == "human")
            assert re.search(r"\byes\b", last_user, re.IGNORECASE), (i, name, last_user)
        if name in STATUS_RULES:
            before, after = STATUS_RULES[name]
            assert orders[args["order_id"]]["status"] == before, (i, name)  # read it first
            assert json.loads(obs)["status"] == after, (i, name)
        if obs.startswith("{") and '"order_id"' in obs:
            order = json.loads(obs)
            orders[order["order_id"]] = order


# ids and card digits the agent may only know from the user or a tool
GROUNDED = re.compile(
    r"#W\d{7}|\b(?:credit_card|paypal|gift_card)_\d+\b|\b\d{10}\b|(?<=ending )\d{4}\b"
)


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_seed_agent_mentions_are_grounded(seed: dict[str, Any]) -> None:
    seen = ""
    for turn in seed["conversations"]:
        if turn["from"] == "gpt":
            unknown = {m for m in GROUNDED.findall(turn["value"]) if m not in seen}
            assert unknown == set(), turn["value"]
        elif turn["from"] != "function_call":
            seen += "\n" + turn["value"]


def test_seeds_are_reproduced_by_their_author_script() -> None:
    """seeds.jsonl is what seeds/retail/author.py writes (observations executed, not typed)."""
    import runpy

    module = runpy.run_path(str(ROOT / "seeds" / "retail" / "author.py"), run_name="author")
    assert [s.turns for s in module["SEEDS"]] == [s["conversations"] for s in SEEDS]


def test_retail_envsim_recipe_selects_balance2_over_the_retail_pack() -> None:
    from factory.core.mixture import Mixture

    cfg = load_recipe(ROOT / "pipelines" / "retail-envsim.yaml")
    assert cfg.pipeline == "envsim" and cfg.domain.name == "retail"
    assert cfg.domain.tools and cfg.resolve(cfg.domain.tools) == TOOLS_PATH
    assert cfg.mixture is not None
    mixture = Mixture.load(cfg.resolve(cfg.mixture.path))
    assert sum(q.count for q in mixture.quotas) == 6230  # EnvSimBench's Balance2


def test_seed_observations_are_what_the_retail_world_answers() -> None:
    """Every seed's calls, replayed on the executable retail world over the seeds' store,
    answer exactly what the seed says (the retail world comes from the retail plug-in)."""
    import runpy
    from copy import deepcopy

    try:
        from factory.envs.retail import RetailEnv  # type: ignore[attr-defined]
    except ImportError:
        pytest.skip("the executable retail world (factory.envs.retail.RetailEnv) is not here")
    store = runpy.run_path(str(ROOT / "seeds" / "retail" / "author.py"), run_name="author")
    store = store["Store"]()
    state = {"users": store.users, "orders": store.orders, "products": store.products}

    def parsed(text: str) -> Any:
        return json.loads(text) if text[:1] in ("{", "[") else text

    mismatches = []
    for seed in SEEDS:
        env = RetailEnv(deepcopy(state))
        for i, call, obs in steps(seed):
            got = env.execute(call["name"], call["arguments"])
            if parsed(got) != parsed(obs):
                mismatches.append((seed["metadata"]["scenario"], i, call["name"]))
    assert mismatches == []
