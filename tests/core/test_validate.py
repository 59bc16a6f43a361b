"""Tool-call schema validation and the combined, ordered ``validate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.core.actions import ACTION_CODES
from factory.core.compose import COMPOSE_CODES
from factory.core.reasons import REASONS, Issue
from factory.core.rules import DomainRules
from factory.core.schema import _compile, compile_schema, format_path
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.core.validate import (
    ISSUE_ORDER,
    _tool_table,
    first_reason,
    validate,
    validate_calls,
)
from tests.conftest import ROOT as REPO_ROOT

ROOT = REPO_ROOT

BOOK = {
    "name": "book",
    "description": "Book a trip.",
    "x-kind": "write",
    "parameters": {
        "type": "object",
        "properties": {
            "user_id": {"type": "string"},
            "cabin": {"type": "string", "enum": ["economy", "business"]},
            "bags": {"type": "integer", "minimum": 0},
            "passengers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "dob": {"type": "string"},
                    },
                    "required": ["name", "dob"],
                },
            },
            "payment": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["id"],
                "additionalProperties": False,
            },
            "labels": {
                "type": "object",
                "properties": {"kind": {"type": "string"}},
                "additionalProperties": {"type": "string"},
            },
            "meta": {
                "type": "object",
                "properties": {},
                "patternProperties": {"^tag_": {"type": "string"}},
            },
        },
        "required": ["user_id", "cabin"],
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Find.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
TOOLS = [BOOK, LOOKUP]
GOOD = {
    "user_id": "sara_doe_496",
    "cabin": "economy",
    "bags": 1,
    "passengers": [{"name": "Sara", "dob": "1990-01-01"}],
    "payment": {"id": "credit_card_1", "amount": 120.5},
    "labels": {"kind": "x", "anything": "goes"},
    "meta": {"tag_a": "t"},
}


def trajectory(*turns: Turn, tools: list[Any] | None = None) -> Trajectory:
    return Trajectory(system="s", tools=TOOLS if tools is None else tools, turns=list(turns))


def booking(arguments: Any, name: str = "book") -> Trajectory:
    return trajectory(
        Turn("user", "book it"),
        Turn("assistant", "", [ToolCall(name, arguments)]),
        Turn("tool", "ok", name=name),
        Turn("assistant", "Booked."),
    )


def with_args(**changes: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is ...:
            out.pop(key)
        else:
            out[key] = value
    return out


# --- validate_calls ---------------------------------------------------------------------------
def test_valid_calls_pass() -> None:
    assert validate_calls(booking(GOOD)) == []
    assert validate(booking(GOOD)) == []
    assert validate_calls(booking({"q": "x"}, name="lookup")) == []


@pytest.mark.parametrize(
    ("arguments", "code", "path"),
    [
        pytest.param(with_args(user_id=...), "missing_argument", "user_id", id="missing"),
        pytest.param(
            with_args(passengers=[{"name": "A"}]),
            "missing_argument",
            "passengers[0].dob",
            id="missing-nested",
        ),
        pytest.param(with_args(bags="1"), "wrong_type", "bags", id="type"),
        pytest.param(
            with_args(passengers=[{"name": "A", "dob": 19900101}]),
            "wrong_type",
            "passengers[0].dob",
            id="type-nested",
        ),
        pytest.param(with_args(cabin="first"), "enum_violation", "cabin", id="enum"),
        pytest.param(with_args(bags=-1), "schema_violation", "bags", id="minimum"),
        pytest.param(with_args(seat="12A"), "unknown_argument", "seat", id="undeclared-top"),
        pytest.param(
            with_args(passengers=[{"name": "A", "dob": "1990-01-01", "origin": "SFO"}]),
            "unknown_argument",
            "passengers[0].origin",
            id="undeclared-nested",
        ),
        pytest.param(
            with_args(payment={"id": "gift_card_1", "note": "x"}),
            "unknown_argument",
            "payment.note",
            id="additionalProperties-false",
        ),
        pytest.param(
            with_args(meta={"tag_a": "t", "other": 1}),
            "unknown_argument",
            "meta.other",
            id="outside-patternProperties",
        ),
    ],
)
def test_call_issue_codes_and_paths(arguments: dict[str, Any], code: str, path: str) -> None:
    issues = validate_calls(booking(arguments))
    assert [(i.code, i.path, i.turn) for i in issues] == [(code, path, 1)]
    assert issues[0].message.startswith("book: ")
    assert code in REASONS


def test_several_missing_arguments_each_reported_once() -> None:
    issues = validate_calls(booking({"bags": 0}))
    assert sorted((i.code, i.path) for i in issues) == [
        ("missing_argument", "cabin"),
        ("missing_argument", "user_id"),
    ]


def test_explicitly_open_objects_allow_extra_keys() -> None:
    assert validate_calls(booking(with_args(labels={"kind": "a", "free": "b"}))) == []
    wrong = validate_calls(booking(with_args(labels={"free": 3})))
    assert [(i.code, i.path) for i in wrong] == [("wrong_type", "labels.free")]


def test_unknown_tool_and_non_object_arguments() -> None:
    t = trajectory(
        Turn("user", "q"),
        Turn("assistant", "", [ToolCall("teleport", {}), ToolCall("lookup", ["q"])]),  # type: ignore[arg-type]
        Turn("tool", "1"),
        Turn("tool", "2"),
        Turn("assistant", "done"),
    )
    assert [(i.code, i.turn) for i in validate_calls(t)] == [
        ("unknown_tool", 1),
        ("arguments_not_object", 1),
    ]


def test_broken_tool_specs_are_bad_tools_not_unknown_tools() -> None:
    broken = {"name": "book", "parameters": {"type": "object", "properties": {"a": {"type": 3}}}}
    issues = validate_calls(_with_tools(booking(GOOD), [broken, {}, LOOKUP, LOOKUP]))
    assert [i.code for i in issues] == ["bad_tools", "bad_tools", "bad_tools"]
    assert [i.path for i in issues] == [
        "tools[0].parameters.properties.a.type",
        "tools[1]",
        "tools[3].name",
    ]


def _with_tools(t: Trajectory, tools: list[Any]) -> Trajectory:
    t.tools = tools
    return t


def test_openai_wrapped_specs_are_accepted() -> None:
    assert validate_calls(booking({"q": 1}, name="lookup"))[0].code == "wrong_type"


def test_compiled_validators_are_cached_per_schema() -> None:
    first = compile_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    again = compile_schema({"properties": {"a": {"type": "string"}}, "type": "object"})
    assert first is again
    _compile.cache_clear()
    _tool_table.cache_clear()
    for args in (GOOD, with_args(bags="x"), with_args(cabin=...)):
        validate_calls(booking(args))
        validate_calls(_with_tools(booking(args), list(reversed(TOOLS))))
    assert _compile.cache_info().misses == 2  # one per distinct parameters schema


def test_schema_draft_comes_from_dollar_schema() -> None:
    draft7 = compile_schema({"$schema": "http://json-schema.org/draft-07/schema#"})
    assert type(draft7).__name__ == "Draft7Validator"
    assert type(compile_schema({})).__name__ == "Draft202012Validator"


@pytest.mark.parametrize(
    ("parts", "text"),
    [((), ""), (("a",), "a"), (("passengers", 0, "dob"), "passengers[0].dob"), ((0, "x"), "[0].x")],
)
def test_format_path(parts: tuple[Any, ...], text: str) -> None:
    assert format_path(parts) == text


# --- validate: every code reachable from a canonical trajectory -------------------------------
RULES = DomainRules.from_dict(
    {
        "domain": "test",
        "limits": {"max_parallel_calls": 1},
        "rules": [{"id": "user_id_format", "argument": "user_id", "schema": {"pattern": "_\\d+$"}}],
    }
)


def _u(text: Any = "q") -> Turn:
    return Turn("user", text)


def _a(text: str = "", *calls: ToolCall, reasoning: str | None = None) -> Turn:
    return Turn("assistant", text, list(calls), reasoning)


def _t(text: str = "r") -> Turn:
    return Turn("tool", text)


LOOK = ToolCall("lookup", {"q": "x"})

REACHABLE = {
    "empty_trajectory": trajectory(_u("only"), _u("users")),
    "bad_role": trajectory(_u(), Turn("system", "late system prompt"), _a("a")),  # type: ignore[arg-type]
    "bad_field_type": trajectory(_u(3), _u("x"), _a("a")),
    "bad_tools": _with_tools(trajectory(_u(), _a("a")), [{"description": "nameless"}]),
    "bad_turn_order": trajectory(_a("I speak first")),
    "no_assistant_ending": trajectory(_u(), _a("", LOOK), _a("no result in between")),
    "unanswered_call": trajectory(_u(), _a("", LOOK), _a("answer without result")),
    "orphan_observation": trajectory(_u(), _a("a"), _t(), _a("b")),
    "bad_function_call": trajectory(
        _u(), _a("", LOOK, reasoning="x\n</think>\n\ny"), _t(), _a("b")
    ),
    "empty_turn": trajectory(_u(""), _a("a")),
    "stray_think_tag": trajectory(_u(), _a("fine </think> then")),
    "arguments_not_object": booking("not an object"),
    "unknown_tool": booking({}, name="teleport"),
    "missing_argument": booking(with_args(cabin=...)),
    "unknown_argument": booking(with_args(seat="1A")),
    "wrong_type": booking(with_args(cabin=1)),
    "enum_violation": booking(with_args(cabin="first")),
    "schema_violation": booking(with_args(bags=-2)),
    "domain:user_id_format": booking(with_args(user_id="sara")),
    "domain:max_parallel_calls": trajectory(_u(), _a("", LOOK, LOOK), _t(), _t(), _a("b")),
}


def test_reachable_covers_every_code_validate_produces() -> None:
    # Text-action and composition codes need a grammar: tests/core/test_actions.py and
    # test_compose.py reach each of them through validate.
    text_codes = set(ACTION_CODES) | set(COMPOSE_CODES)
    assert set(ISSUE_ORDER) - text_codes <= set(REACHABLE)
    assert text_codes <= set(ISSUE_ORDER)
    assert all(code in REASONS for code in ISSUE_ORDER)


@pytest.mark.parametrize("code", sorted(REACHABLE))
def test_every_code_is_reachable(code: str) -> None:
    issues = validate(REACHABLE[code], rules=RULES)
    assert code in [i.code for i in issues]
    assert first_reason(issues) == issues[0].code


def test_issues_ordered_most_fundamental_first() -> None:
    t = trajectory(
        _u("book for sara"),
        _a("", ToolCall("book", with_args(user_id="sara", cabin="first", seat="1"))),
        _a("Booked without waiting for the result."),
    )
    codes = [i.code for i in validate(t, rules=RULES)]
    assert codes == [
        "bad_turn_order",  # gpt right after function_call
        "no_assistant_ending",  # 3 turns cannot pair up
        "unanswered_call",
        "unknown_argument",
        "enum_violation",
        "domain:user_id_format",
    ]
    assert first_reason(list(reversed(validate(t, rules=RULES)))) == "bad_turn_order"
    assert first_reason([]) is None


def test_structure_issue_turns_point_at_the_callers_turns() -> None:
    # turns 0-1 merge and turn 3 is dropped by normalize; the orphan result is turn 5
    t = trajectory(_u("a"), _u("b"), _a("x"), _a(""), _a("y"), _t("stray"), _a("z"))
    issues = validate(t)
    assert [(i.code, i.turn) for i in issues] == [("orphan_observation", 5)]


def test_validate_reasoning_mode_matters_only_for_reasoning() -> None:
    t = REACHABLE["bad_function_call"]
    assert "bad_function_call" in [i.code for i in validate(t)]
    assert validate(t, reasoning="strip") == []


def test_validate_does_not_modify_its_input() -> None:
    t = trajectory(_u("a"), _u("b"), _a("x", LOOK), _t(), _a("y"), _u("###STOP###"))
    before = t.to_json()
    assert validate(t) == []
    assert t.to_json() == before


def test_issue_is_the_shared_reason_type() -> None:
    assert all(isinstance(i, Issue) for i in validate(REACHABLE["wrong_type"]))


# --- real data ----------------------------------------------------------------------------
def _from_openai(record: dict[str, Any], tools: list[Any]) -> Trajectory:
    """Enough of an OpenAI-messages reader for tau-bench's trajectories (not the real one)."""
    system, turns = "", []
    for m in record["traj"]:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "assistant":
            calls = [
                ToolCall(c["function"]["name"], json.loads(c["function"]["arguments"]), c["id"])
                for c in m.get("tool_calls") or []
            ]
            turns.append(Turn("assistant", m.get("content") or "", calls))
        elif m["role"] == "tool":
            turns.append(Turn("tool", m["content"], name=m.get("name")))
        else:
            turns.append(Turn("user", m["content"]))
    return Trajectory(system=system, tools=tools, turns=turns)


@pytest.mark.shared
def test_tau_bench_trajectories_validate(taubench_dir: Path) -> None:
    """All 200 GPT-4o runs export cleanly; the one finding is a call with invented arguments.

    In task 5 GPT-4o adds origin/destination to each flight of update_reservation_flights,
    which tau-bench's schema does not declare (it also omits additionalProperties).
    """
    records = json.loads((taubench_dir / "gpt-4o-airline.json").read_text(encoding="utf-8"))
    tools = json.loads((taubench_dir / "tools.json").read_text(encoding="utf-8"))
    rules = DomainRules.load(ROOT / "filters" / "airline.yaml")
    found = {
        (r["task_id"], i.code, i.path)
        for r in records
        for i in validate(_from_openai(r, tools), rules=rules)
    }
    assert found == {
        (5, "unknown_argument", f"flights[{n}].{key}")
        for n in (0, 1)
        for key in ("origin", "destination")
    }


@pytest.mark.parametrize(
    "turn",
    [
        Turn("assistant", None),  # type: ignore[arg-type]
        Turn("assistant", "a", reasoning=["r"]),  # type: ignore[arg-type]
        Turn("assistant", "", tool_calls=[{"name": "lookup"}]),  # type: ignore[list-item]
        Turn("assistant", "", tool_calls=[ToolCall(["lookup"], {})]),  # type: ignore[arg-type]
    ],
)
def test_malformed_turns_are_reported_not_raised(turn: Turn) -> None:
    issues = validate(trajectory(_u(), _u(), turn, _a("b")), rules=RULES)
    assert [(i.code, i.turn) for i in issues] == [("bad_field_type", 2)]


def test_tools_not_a_list_is_bad_tools() -> None:
    t = booking(GOOD)
    t.tools = None  # type: ignore[assignment]
    assert [i.code for i in validate_calls(t)] == ["bad_tools", "unknown_tool"]
