"""The airline domain pack: tool specs, argument rules and authored seeds agree.

The pack is data, so its failure modes are silent: a tool spec that no longer
accepts tau-bench's calls, a rule with a typo in its argument path that never
fires, a seed whose observation contradicts its own call. These tests read the
files as a consumer would and check each of those, with jsonschema doing the
schema work. Rules are evaluated here directly (not through factory.core.rules) so
the data is checked independently of the code that will load it.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator, FormatChecker

from tests.conftest import ROOT as REPO_ROOT

ROOT = REPO_ROOT
TAUBENCH = ROOT.parent / "shared" / "data" / "taubench-airline"
TOOLS_PATH = ROOT / "prompts" / "airline" / "tools.json"
POLICY_PATH = ROOT / "prompts" / "airline" / "policy.md"
RULES_PATH = ROOT / "filters" / "airline.yaml"
SEEDS_PATH = ROOT / "seeds" / "airline" / "seeds.jsonl"

KINDS = {
    "book_reservation": "write",
    "calculate": "generic",
    "cancel_reservation": "write",
    "get_reservation_details": "read",
    "get_user_details": "read",
    "list_all_airports": "read",
    "search_direct_flight": "read",
    "search_onestop_flight": "read",
    "send_certificate": "write",
    "think": "generic",
    "transfer_to_human_agents": "generic",
    "update_reservation_baggages": "write",
    "update_reservation_flights": "write",
    "update_reservation_passengers": "write",
}
REQUIRED_SCENARIOS = {
    "book_one_way",
    "book_round_trip",
    "book_multi_passenger",
    "book_mixed_payment",
    "book_with_insurance",
    "cancel_within_24h",
    "cancel_insured",
    "cancel_business",
    "cancel_airline_cancelled",
    "cancel_refused",
    "baggage_update",
    "flight_change",
    "flight_change_basic_economy_refused",
    "cabin_upgrade",
    "passenger_update",
    "certificate_cancelled_flight",
    "certificate_delayed_flight",
    "transfer_to_human",
    "tool_error_recovery",
    "think_calculate",
}
# Free checked bags per passenger, by booking user's membership and cabin (policy.md).
FREE_BAGS = {
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 3},
}
NOW = "2024-05-15T15:00:00"

TOOLS: list[dict[str, Any]] = json.loads(TOOLS_PATH.read_text(encoding="utf-8"))
SPECS = {t["name"]: t for t in TOOLS}
RULES_DOC: dict[str, Any] = yaml.safe_load(RULES_PATH.read_text(encoding="utf-8"))
RULES: list[dict[str, Any]] = RULES_DOC["rules"]
SEEDS: list[dict[str, Any]] = [
    json.loads(line) for line in SEEDS_PATH.read_text(encoding="utf-8").splitlines() if line
]
SEED_IDS = [f"{i}-{s['metadata']['scenario']}" for i, s in enumerate(SEEDS)]


# --- helpers ----------------------------------------------------------------------------
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
    failed = []
    for rule in RULES:
        if "tools" in rule and tool not in rule["tools"]:
            continue
        check = Draft202012Validator(rule["schema"])
        if any(not check.is_valid(v) for v in values_at(arguments, rule["argument"])):
            failed.append(rule["id"])
    return failed


def arg_validator(tool: str) -> Draft202012Validator:
    return Draft202012Validator(SPECS[tool]["parameters"], format_checker=FormatChecker())


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def arithmetic(expression: str) -> float:
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"not plain arithmetic: {expression!r}")

    return ev(ast.parse(expression, mode="eval").body)


def steps(seed: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(index, call, observation text) for every function_call of a seed."""
    conv = seed["conversations"]
    for i, turn in enumerate(conv):
        if turn["from"] == "function_call":
            yield i, json.loads(turn["value"]), conv[i + 1]["value"]


def as_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def fare_total(res: dict[str, Any]) -> int:
    n = len(res["passengers"])
    insurance = 30 * n if res["insurance"] == "yes" else 0
    return sum(f["price"] for f in res["flights"]) * n + insurance + 50 * res["nonfree_baggages"]


def known_users(seed: dict[str, Any], upto: int) -> dict[str, dict[str, Any]]:
    users = {}
    for i, call, obs in steps(seed):
        if i < upto and call["name"] == "get_user_details" and not obs.startswith("Error"):
            users[call["arguments"]["user_id"]] = json.loads(obs)
    return users


def known_reservations(seed: dict[str, Any], upto: int) -> dict[str, dict[str, Any]]:
    found = {}
    for i, _call, obs in steps(seed):
        data = as_json(obs)
        if i < upto and isinstance(data, dict) and "reservation_id" in data:
            found[data["reservation_id"]] = data
    return found


# --- tools.json ---------------------------------------------------------------------------
def test_tools_are_the_fourteen_airline_tools_with_kinds() -> None:
    assert [t["name"] for t in TOOLS] == sorted(KINDS)
    for tool in TOOLS:
        assert set(tool) == {"name", "description", "parameters", "x-kind"}, tool["name"]
        assert tool["x-kind"] == KINDS[tool["name"]]
        assert tool["description"].strip()
        Draft202012Validator.check_schema(tool["parameters"])
        assert tool["parameters"]["type"] == "object"
        assert tool["parameters"].get("additionalProperties") is False, tool["name"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("get_reservation_details", {"reservation_id": "ZFA04Y", "user_id": "sara_doe_496"}),
        ("book_reservation", {"user_id": "sara_doe_496"}),
        (
            "update_reservation_baggages",
            {
                "reservation_id": "ZFA04Y",
                "total_baggages": -1,
                "nonfree_baggages": 0,
                "payment_id": "credit_card_1",
            },
        ),
        (
            "update_reservation_passengers",
            {
                "reservation_id": "ZFA04Y",
                "passengers": [{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}] * 6,
            },
        ),
        ("search_direct_flight", {"origin": "JFK", "destination": "LAX", "date": "2024-13-01"}),
        ("send_certificate", {"user_id": "sara_doe_496", "amount": 0}),
        ("cancel_reservation", {"reservation_id": 123456}),
    ],
)
def test_tool_schemas_reject_malformed_calls(tool: str, arguments: dict[str, Any]) -> None:
    assert not arg_validator(tool).is_valid(arguments)


def _reference_tools() -> dict[str, dict[str, Any]]:
    if not TAUBENCH.is_dir():
        pytest.skip(f"tau-bench reference data not found at {TAUBENCH}")
    raw = json.loads((TAUBENCH / "tools.json").read_text(encoding="utf-8"))
    return {t["function"]["name"]: t["function"] for t in raw}


def _shape(schema: dict[str, Any]) -> Any:
    """What a caller must match: types, enums, required lists and property names, recursively."""
    out: dict[str, Any] = {"type": schema.get("type"), "enum": schema.get("enum")}
    if "properties" in schema:
        out["properties"] = {k: _shape(v) for k, v in schema["properties"].items()}
        out["required"] = sorted(schema.get("required", []))
    if "items" in schema:
        out["items"] = _shape(schema["items"])
    return out


@pytest.mark.shared
def test_tools_match_taubench_signatures_in_own_words() -> None:
    reference = _reference_tools()
    assert set(reference) == set(SPECS)
    for name, ref in reference.items():
        assert _shape(SPECS[name]["parameters"]) == _shape(ref["parameters"]), name
        assert SPECS[name]["description"] != ref["description"], name


def _taubench_calls() -> list[tuple[int, str, dict[str, Any]]]:
    if not TAUBENCH.is_dir():
        pytest.skip(f"tau-bench reference data not found at {TAUBENCH}")
    runs = json.loads((TAUBENCH / "gpt-4o-airline.json").read_text(encoding="utf-8"))
    return [
        (run["task_id"], call["function"]["name"], json.loads(call["function"]["arguments"]))
        for run in runs
        for msg in run["traj"]
        for call in msg.get("tool_calls") or []
    ]


@pytest.mark.shared
def test_every_taubench_call_passes_schemas_and_rules() -> None:
    calls = _taubench_calls()
    assert len(calls) == 1164
    validators = {name: arg_validator(name) for name in SPECS}
    bad = [
        (
            task,
            name,
            [e.message for e in validators[name].iter_errors(args)],
            rule_failures(name, args),
        )
        for task, name, args in calls
        if not validators[name].is_valid(args) or rule_failures(name, args)
    ]
    assert bad == []


# --- filters/airline.yaml -------------------------------------------------------------------
def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    for segment in path.split("."):
        many = segment.endswith("[]")
        schema = schema.get("properties", {}).get(segment[:-2] if many else segment)
        if schema is None:
            return None
        if many:
            schema = schema.get("items")
            if schema is None:
                return None
    return schema


def test_rules_file_is_well_formed_and_every_rule_can_fire() -> None:
    assert RULES_DOC["domain"] == "airline"
    assert RULES_DOC["limits"] == {"max_parallel_calls": 1}
    ids = [r["id"] for r in RULES]
    assert len(ids) == len(set(ids))
    for rule in RULES:
        assert set(rule) <= {"id", "description", "tools", "argument", "schema"}, rule["id"]
        assert re.fullmatch(r"[a-z0-9_]+", rule["id"]) and rule["description"].strip()
        Draft202012Validator.check_schema(rule["schema"])
        for tool in rule["tools"]:
            # a typo in the path would make the rule silently never apply
            assert _schema_at(SPECS[tool]["parameters"], rule["argument"]), (rule["id"], tool)


RULE_CASES = {
    "reservation_id_format": (["ZFA04Y", "8JX2WO"], ["zfa04y", "ZFA04", "ZFA04YY", "ZFA04Y\n", 7]),
    "user_id_format": (
        ["sara_doe_496", "mary_ann_lee_12"],
        ["Sara_Doe_496", "sara_doe", "sara doe 496", "sara_doe_496\n"],
    ),
    "payment_id_format": (
        ["credit_card_7815826", "gift_card_1", "certificate_42"],
        ["paypal_1", "credit_card_", "credit_card_7447x", "7815826"],
    ),
    "flight_number_format": (["HAT001", "HAT299"], ["HAT01", "hat001", "AA1234", "HAT0012"]),
    "flight_date_format": (
        ["2024-05-01", "2024-12-31"],
        ["2024-5-1", "05/01/2024", "2024-13-01", "2024-05-32"],
    ),
    "origin_airport_code": (["SFO", "JFK"], ["sfo", "SFOO", "San Francisco"]),
    "cabin_value": (["basic_economy", "business"], ["first", "Economy"]),
    "passenger_dob_format": (["1990-01-01"], ["01-01-1990", "1990-1-1"]),
    "passenger_first_name_present": (["Noah"], ["", "  "]),
    "payment_amount_non_negative": ([0, 12.5, 250], [-1, "250"]),
    "certificate_amount_positive": ([50, 100.0], [0, -50]),
    "baggage_count_non_negative": ([0, 3], [-1, 1.5, "2"]),
}


@pytest.mark.parametrize("rule_id", sorted(RULE_CASES))
def test_rule_accepts_good_and_rejects_bad_values(rule_id: str) -> None:
    rule = next(r for r in RULES if r["id"] == rule_id)
    check = Draft202012Validator(rule["schema"])
    good, bad = RULE_CASES[rule_id]
    assert [v for v in good if not check.is_valid(v)] == []
    assert [v for v in bad if check.is_valid(v)] == []


# --- seeds ----------------------------------------------------------------------------------
def test_seed_file_shape_and_coverage() -> None:
    assert len(SEEDS) >= 32
    public = [{k: v for k, v in t.items() if k != "x-kind"} for t in TOOLS]
    policy = POLICY_PATH.read_text(encoding="utf-8")
    for seed in SEEDS:
        assert set(seed) == {"conversations", "tools", "system", "metadata"}
        assert json.loads(seed["tools"]) == public
        assert seed["system"] == policy
    scenarios = {s["metadata"]["scenario"] for s in SEEDS}
    assert REQUIRED_SCENARIOS - scenarios == set()
    assert "2024-05-15 15:00:00 EST" in policy


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_seed_turn_order_is_llamafactory_valid(seed: dict[str, Any]) -> None:
    conv = seed["conversations"]
    assert 4 <= len(conv) <= 14
    for i, turn in enumerate(conv):
        assert set(turn) == {"from", "value"} and isinstance(turn["value"], str)
        allowed = ("human", "observation") if i % 2 == 0 else ("gpt", "function_call")
        assert turn["from"] in allowed, (i, turn["from"])
        # an observation answers exactly the call right before it
        assert (turn["from"] == "observation") == (i > 0 and conv[i - 1]["from"] == "function_call")
        if turn["from"] in ("human", "gpt"):
            assert turn["value"].strip(), i
    assert conv[0]["from"] == "human"
    assert conv[-1]["from"] == "gpt"


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_seed_calls_satisfy_schemas_rules_and_confirmation(seed: dict[str, Any]) -> None:
    conv = seed["conversations"]
    for i, call, _obs in steps(seed):
        assert set(call) == {"name", "arguments"}
        name, args = call["name"], call["arguments"]
        errors = [e.message for e in arg_validator(name).iter_errors(args)]
        assert errors == [], (i, name)
        assert rule_failures(name, args) == [], (i, name)
        if KINDS[name] == "write":
            last_user = next(t["value"] for t in reversed(conv[:i]) if t["from"] == "human")
            assert re.search(r"\byes\b", last_user, re.IGNORECASE), (i, name, last_user)


# ids, card digits and flight numbers the agent may only know from the user or a tool
GROUNDED = re.compile(
    r"\b(?:(?:credit_card|gift_card|certificate)_\d+|HAT\d{3}|[A-Z0-9]{6})\b|(?<=ending )\d{4}\b"
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


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_seed_observations_agree_with_their_calls(seed: dict[str, Any]) -> None:
    for i, call, obs in steps(seed):
        name, args = call["name"], call["arguments"]
        data = as_json(obs)
        if isinstance(data, dict) and "payment_history" in data:
            paid = sum(p["amount"] for p in data["payment_history"])
            expected = 0 if data.get("status") == "cancelled" else fare_total(data)
            assert paid == expected, (i, data["reservation_id"])
        if name == "calculate":
            assert obs == str(round(arithmetic(args["expression"]), 2))
        elif name == "think":
            assert obs == ""
        elif name == "transfer_to_human_agents":
            assert obs == "Transfer successful"
        elif name == "send_certificate":
            assert re.fullmatch(
                rf"Certificate certificate_\d+ added to user {args['user_id']} "
                rf"with amount {args['amount']}\.",
                obs,
            )
        elif name == "get_reservation_details":
            assert (
                obs == "Error: reservation not found"
                or data["reservation_id"] == args["reservation_id"]
            )
        elif name == "get_user_details":
            assert obs == "Error: user not found" or all(
                k == m["id"] for k, m in data["payment_methods"].items()
            )
        elif name == "cancel_reservation":
            assert (
                data["reservation_id"] == args["reservation_id"] and data["status"] == "cancelled"
            )
        elif name == "update_reservation_baggages":
            assert (data["total_baggages"], data["nonfree_baggages"]) == (
                args["total_baggages"],
                args["nonfree_baggages"],
            )
        elif name == "update_reservation_passengers":
            assert data["passengers"] == args["passengers"]
        elif name in ("book_reservation", "update_reservation_flights"):
            legs = [(f["flight_number"], f["date"]) for f in data["flights"]]
            assert legs == [(f["flight_number"], f["date"]) for f in args["flights"]]
            assert data["cabin"] == args["cabin"]
        if name == "book_reservation":
            assert data["payment_history"] == args["payment_methods"]
            assert data["passengers"] == args["passengers"] and data["created_at"] == NOW
            assert data["origin"] == args["origin"] == data["flights"][0]["origin"]


def _check_booking(args: dict[str, Any], users: dict[str, Any]) -> None:
    user = users[args["user_id"]]  # the agent looked the user up before booking
    methods = user["payment_methods"]
    sources = [methods[p["payment_id"]]["source"] for p in args["payment_methods"]]
    assert sources.count("certificate") <= 1 and sources.count("credit_card") <= 1
    assert sources.count("gift_card") <= 3
    for p in args["payment_methods"]:
        if methods[p["payment_id"]]["source"] != "credit_card":
            assert p["amount"] <= methods[p["payment_id"]]["amount"]
    free = FREE_BAGS[user["membership"]][args["cabin"]] * len(args["passengers"])
    assert args["nonfree_baggages"] == max(0, args["total_baggages"] - free)


def _check_change(
    name: str, args: dict[str, Any], obs: Any, res: dict[str, Any], user: dict[str, Any] | None
) -> None:
    if "payment_id" in args:
        assert not args["payment_id"].startswith("certificate_")
        saved = set(user["payment_methods"]) if user else set()
        assert args["payment_id"] in saved | {p["payment_id"] for p in res["payment_history"]}
    if name == "update_reservation_baggages":
        assert args["total_baggages"] >= res["total_baggages"]  # bags are never removed
        if user is not None:
            free = FREE_BAGS[user["membership"]][res["cabin"]] * len(res["passengers"])
            assert args["nonfree_baggages"] == max(0, args["total_baggages"] - free)
    elif name == "update_reservation_flights":
        old = [(f["flight_number"], f["date"]) for f in res["flights"]]
        if res["cabin"] == "basic_economy":
            assert [(f["flight_number"], f["date"]) for f in args["flights"]] == old
        assert obs["flights"][0]["origin"] == res["origin"]
        if res["flight_type"] == "one_way":
            assert obs["flights"][-1]["destination"] == res["destination"]
        else:
            assert obs["flights"][-1]["destination"] == res["origin"]
    elif name == "update_reservation_passengers":
        assert len(args["passengers"]) == len(res["passengers"])


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_seed_writes_follow_the_policy(seed: dict[str, Any]) -> None:
    for i, call, obs in steps(seed):
        name, args = call["name"], call["arguments"]
        users = known_users(seed, i)
        if name == "book_reservation":
            _check_booking(args, users)
        elif name.startswith("update_reservation_"):
            res = known_reservations(seed, i)[args["reservation_id"]]
            _check_change(name, args, as_json(obs), res, users.get(res["user_id"]))
        elif name == "send_certificate":
            assert args["amount"] % 50 == 0
