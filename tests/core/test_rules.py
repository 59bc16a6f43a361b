"""Domain rules: strict loading with key paths, argument-path walking, reason codes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from factory.core.rules import MAX_PARALLEL_CALLS, DomainRules, Rule, parse_path
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.errors import ConfigError
from tests.conftest import ROOT as REPO_ROOT

ROOT = REPO_ROOT

DOC: dict[str, Any] = {
    "domain": "airline",
    "limits": {"max_parallel_calls": 1},
    "rules": [
        {
            "id": "reservation_id_format",
            "description": "Six upper-case letters or digits.",
            "tools": ["get_reservation_details", "cancel_reservation"],
            "argument": "reservation_id",
            "schema": {"type": "string", "pattern": "^[A-Z0-9]{6}$"},
        },
        {
            "id": "booking_payment_id_format",
            "tools": ["book_reservation"],
            "argument": "payment_methods[].payment_id",
            "schema": {"type": "string", "pattern": "^(credit_card|gift_card|certificate)_[0-9]+$"},
        },
        {
            "id": "amount_positive",
            "argument": "amount",
            "schema": {"type": "number", "exclusiveMinimum": 0},
        },
    ],
}


def rules(**changes: Any) -> DomainRules:
    return DomainRules.from_dict({**copy.deepcopy(DOC), **changes})


def calls_traj(*turn_calls: list[ToolCall]) -> Trajectory:
    turns: list[Turn] = [Turn("user", "hi")]
    for calls in turn_calls:
        turns.append(Turn("assistant", "", list(calls)))
        turns.extend(Turn("tool", "ok") for _ in calls)
    turns.append(Turn("assistant", "done"))
    return Trajectory(turns=turns)


def one(name: str, **arguments: Any) -> Trajectory:
    return calls_traj([ToolCall(name, arguments)])


# --- loading ----------------------------------------------------------------------------------
def test_from_dict() -> None:
    r = rules()
    assert r.domain == "airline"
    assert r.max_parallel_calls == 1
    assert [rule.id for rule in r.rules] == [
        "reservation_id_format",
        "booking_payment_id_format",
        "amount_positive",
    ]
    assert r.rules[0].tools == frozenset({"get_reservation_details", "cancel_reservation"})
    assert r.rules[2].tools is None
    assert r.rules[1].code == "domain:booking_payment_id_format"


def test_minimal_document() -> None:
    r = DomainRules.from_dict({"domain": "retail"})
    assert (r.rules, r.max_parallel_calls) == ((), None)
    assert r.check(one("anything", x=1)) == []


def test_shipped_airline_rules_load(tmp_path: Path) -> None:
    r = DomainRules.load(ROOT / "filters" / "airline.yaml")
    assert r.domain == "airline"
    assert r.max_parallel_calls == 1
    assert "passenger_dob_format" in {rule.id for rule in r.rules}
    # the shipped patterns refuse the trailing newline Python's `$` would let through
    assert [i.code for i in r.check(one("get_reservation_details", reservation_id="ZFA04Y\n"))] == [
        "domain:reservation_id_format"
    ]


def _bad(path: str, value: Any) -> dict[str, Any]:
    """DOC with the value at a dotted/indexed key path replaced (``...`` deletes it)."""
    doc = copy.deepcopy(DOC)
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "key_path", "fragment"),
    [
        pytest.param([], "", "mapping", id="not-a-mapping"),
        pytest.param(_bad("domian", "x"), "domian", "unknown key", id="unknown-top-key"),
        pytest.param(_bad("domain", ...), "domain", "non-empty", id="no-domain"),
        pytest.param(_bad("domain", 3), "domain", "non-empty", id="domain-type"),
        pytest.param(_bad("limits", [1]), "limits", "mapping", id="limits-type"),
        pytest.param(_bad("limits.max_calls", 2), "limits.max_calls", "unknown key", id="lim-key"),
        pytest.param(
            _bad("limits.max_parallel_calls", 0), "limits.max_parallel_calls", "at least 1", id="0"
        ),
        pytest.param(
            _bad("limits.max_parallel_calls", True), "limits.max_parallel_calls", "integer", id="b"
        ),
        pytest.param(_bad("rules", {"id": "x"}), "rules", "list", id="rules-type"),
        pytest.param(_bad("rules[1]", "x"), "rules[1]", "mapping", id="rule-type"),
        pytest.param(_bad("rules[2].argumnt", "a"), "rules[2].argumnt", "unknown key", id="typo"),
        pytest.param(_bad("rules[0].id", ...), "rules[0].id", "required", id="no-id"),
        pytest.param(_bad("rules[2].schema", ...), "rules[2].schema", "required", id="no-schema"),
        pytest.param(_bad("rules[1].argument", ...), "rules[1].argument", "required", id="no-arg"),
        pytest.param(_bad("rules[0].id", "has space"), "rules[0].id", "letters", id="bad-id"),
        pytest.param(
            _bad("rules[2].id", "reservation_id_format"), "rules[2].id", "duplicate", id="dup-id"
        ),
        pytest.param(
            _bad("rules[0].id", "max_parallel_calls"), "rules[0].id", "reserved", id="reserved"
        ),
        pytest.param(
            _bad("rules[0].description", 5), "rules[0].description", "string", id="description"
        ),
        pytest.param(_bad("rules[0].tools", "cancel"), "rules[0].tools", "list", id="tools-str"),
        pytest.param(_bad("rules[0].tools", [""]), "rules[0].tools", "list", id="tools-empty"),
        pytest.param(
            _bad("rules[1].argument", "payment_methods[0].id"), "rules[1].argument", "[]", id="idx"
        ),
        pytest.param(_bad("rules[1].argument", "a..b"), "rules[1].argument", "dotted", id="dots"),
        pytest.param(_bad("rules[1].argument", 7), "rules[1].argument", "dotted", id="arg-type"),
        pytest.param(_bad("rules[2].schema", "number"), "rules[2].schema", "object", id="sch-str"),
        pytest.param(
            _bad("rules[0].schema.pattern", "^[A-Z"),
            "rules[0].schema.pattern",
            "regex",
            id="bad-regex",
        ),
        pytest.param(
            _bad("rules[2].schema.type", "numbr"), "rules[2].schema.type", "Schema", id="bad-type"
        ),
        pytest.param(
            _bad("rules[2].schema.exclusiveMinimum", "0"),
            "rules[2].schema.exclusiveMinimum",
            "Schema",
            id="bad-keyword-value",
        ),
        pytest.param(
            _bad("rules[2].schema.const", {1, 2}), "rules[2].schema", "not JSON", id="not-json"
        ),
    ],
)
def test_malformed_rules_name_the_key_path(doc: Any, key_path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        DomainRules.from_dict(doc)
    assert caught.value.key_path == key_path
    assert fragment in str(caught.value)
    assert str(caught.value).startswith(f"{key_path}: " if key_path else "")
    assert caught.value.exit_code == 2


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "airline.yaml"
    bad.write_text(
        "domain: airline\nrules:\n  - id: x\n    argument: a\n    schema: {pattern: '['}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        DomainRules.load(bad)
    assert caught.value.key_path == "rules[0].schema.pattern"
    assert str(bad) in str(caught.value)

    bad.write_text("domain: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        DomainRules.load(bad)

    with pytest.raises(ConfigError, match="cannot read rules file"):
        DomainRules.load(tmp_path / "missing.yaml")


def test_yaml_dates_must_be_quoted(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "domain: d\nrules:\n  - {id: day, argument: date, schema: {const: 2024-05-01}}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="quote dates") as caught:
        DomainRules.load(path)
    assert caught.value.key_path == "rules[0].schema"


# --- argument paths ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("reservation_id", ("reservation_id",)),
        ("payment_methods[].payment_id", ("payment_methods", None, "payment_id")),
        ("a.b.c", ("a", "b", "c")),
        ("matrix[][]", ("matrix", None, None)),
        ("x-y_z.1", ("x-y_z", "1")),
    ],
)
def test_parse_path(path: str, steps: tuple[str | None, ...]) -> None:
    assert parse_path(path) == steps


@pytest.mark.parametrize("path", ["", ".a", "a.", "a[0]", "a[]b", "[]", "a b", "a[", "a]"])
def test_parse_path_rejects(path: str) -> None:
    with pytest.raises(ValueError, match="dotted"):
        parse_path(path)


@pytest.mark.parametrize(
    ("argument", "arguments", "found"),
    [
        ("a", {"a": 1}, [("a", 1)]),
        ("a", {"b": 1}, []),
        ("a.b", {"a": {"b": None}}, [("a.b", None)]),
        ("a.b", {"a": "not an object"}, []),
        ("l[].id", {"l": [{"id": 1}, {}, {"id": 3}]}, [("l[0].id", 1), ("l[2].id", 3)]),
        ("l[].id", {"l": "not a list"}, []),
        ("m[][]", {"m": [[1], [], [2, 3]]}, [("m[0][0]", 1), ("m[2][0]", 2), ("m[2][1]", 3)]),
        ("l[]", {"l": []}, []),
    ],
)
def test_rule_values(
    argument: str, arguments: dict[str, Any], found: list[tuple[str, Any]]
) -> None:
    rule = Rule(id="r", argument=argument, schema={})
    assert list(rule.values(arguments)) == found


# --- check ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("trajectory", "expected"),
    [
        pytest.param(one("get_reservation_details", reservation_id="ZFA04Y"), [], id="valid"),
        pytest.param(
            one("cancel_reservation", reservation_id="zfa04y"),
            [("domain:reservation_id_format", 1, "reservation_id")],
            id="format",
        ),
        pytest.param(
            one("update_reservation_baggages", reservation_id="zfa04y"), [], id="tool-not-listed"
        ),
        pytest.param(one("cancel_reservation"), [], id="argument-absent"),
        pytest.param(
            one("cancel_reservation", reservation_id=123456),
            [("domain:reservation_id_format", 1, "reservation_id")],
            id="wrong-type",
        ),
        pytest.param(
            one(
                "book_reservation",
                payment_methods=[{"payment_id": "credit_card_1"}, {"payment_id": "cash"}],
            ),
            [("domain:booking_payment_id_format", 1, "payment_methods[1].payment_id")],
            id="list-walk",
        ),
        pytest.param(
            one("send_certificate", amount=0),
            [("domain:amount_positive", 1, "amount")],
            id="every-tool",
        ),
        pytest.param(
            calls_traj([ToolCall("a", {}), ToolCall("b", {})], [ToolCall("c", {})]),
            [(MAX_PARALLEL_CALLS, 1, None)],
            id="parallel",
        ),
        pytest.param(
            calls_traj(
                [ToolCall("cancel_reservation", {"reservation_id": "bad"})],
                [ToolCall("send_certificate", {"amount": -5})],
            ),
            [
                ("domain:reservation_id_format", 1, "reservation_id"),
                ("domain:amount_positive", 3, "amount"),
            ],
            id="turn-order",
        ),
    ],
)
def test_check(trajectory: Trajectory, expected: list[tuple[str, int, str | None]]) -> None:
    issues = rules().check(trajectory)
    assert [(i.code, i.turn, i.path) for i in issues] == expected
    assert all(i.message for i in issues)


def test_check_message_names_tool_path_and_problem() -> None:
    [issue] = rules().check(one("cancel_reservation", reservation_id="zfa04y"))
    assert issue.message.startswith("cancel_reservation: reservation_id: ")
    assert "does not match" in issue.message


def test_no_limit_means_any_number_of_parallel_calls() -> None:
    r = rules(limits={})
    assert r.check(calls_traj([ToolCall("a", {}), ToolCall("b", {}), ToolCall("c", {})])) == []
