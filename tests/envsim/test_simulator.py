"""Simulator format and metrics: prompt, alpaca rows, parsing, FM, strict and lenient CM."""

from __future__ import annotations

import json
from copy import deepcopy
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from factory.core.delta import apply, diff
from factory.envsim.simulator import (
    SIM_MARKER,
    STATE_MARKER,
    SampleError,
    check_sample,
    config_match,
    feedback_match,
    lenient_config_match,
    parse_prediction,
    render_prediction,
    simulation_messages,
    to_alpaca,
)
from factory.errors import RepairError

USER = "ava_ng_1024"
STATE: dict[str, Any] = {
    "users": {
        USER: {
            "name": {"first_name": "Ava", "last_name": "Ng"},
            "payment_methods": {
                "gift_card_1": {"source": "gift_card", "amount": 120, "id": "gift_card_1"},
                "certificate_7": {"source": "certificate", "amount": 250, "id": "certificate_7"},
            },
            "reservations": ["ZFA04Y"],
        }
    },
    "flights": {},
    "reservations": {"ZFA04Y": {"reservation_id": "ZFA04Y", "user_id": USER, "insurance": "no"}},
}
SPEC = {
    "name": "book_reservation",
    "description": "Create a new reservation.",
    "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
    "x-kind": "write",
}


def _after(change: Any) -> dict[str, Any]:
    state = deepcopy(STATE)
    change(state)
    return state


def _spend_certificate(state: dict[str, Any]) -> None:
    """A booking paid by certificate: the certificate disappears, the gift card is untouched."""
    del state["users"][USER]["payment_methods"]["certificate_7"]
    state["users"][USER]["reservations"].append("HATHAT")


def _sample(change: Any = None, observation: str = '{"ok": true}') -> dict[str, Any]:
    after = _after(change) if change else deepcopy(STATE)
    return {
        "id": "s1",
        "tool": "book_reservation",
        "arguments": {"user_id": USER},
        "state_before": deepcopy(STATE),
        "observation": observation,
        "delta": diff(STATE, after),
        "state_after": after,
    }


# --- Feedback Match --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "true", "match"),
    [
        ('{"a": 1, "b": [1, 2]}', '{"b":[1,2],"a":1}', True),  # same JSON, other spacing/order
        ('{"a": 1}', '{"a": 1.0}', False),  # JSON types are compared
        ("true", "1", False),
        ("7", "7.0", False),
        ("15.0", "15.0", True),
        ("[1, 2]", "[2, 1]", False),
        ("Transfer successful", "  Transfer successful\n", True),  # text: stripped equality
        ("Error: user not found", "Error: reservation not found", False),
        ('{"a": 1}', "not json", False),
        ("", "", True),  # think() returns nothing
        ("NaN", "NaN", True),  # not JSON on either side: text equality
    ],
)
def test_feedback_match(pred: str, true: str, match: bool) -> None:
    assert feedback_match(pred, true) is match


def test_feedback_match_rejects_non_strings() -> None:
    assert feedback_match({"a": 1}, '{"a": 1}') is False  # type: ignore[arg-type]


# --- Config Match: strict vs EnvSimBench's lenient ----------------------------------------------


def _extra(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        *ops,
        {
            "op": "replace",
            "path": "/reservations/ZFA04Y/insurance",
            "before": "no",
            "after": "yes",
        },
    ]


def _wrong_value(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = deepcopy(ops)
    for op in out:
        if op["op"] == "replace":
            op["after"] = [*op["after"][:-1], "HATHAU"]
    return out


def _stale_before(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = deepcopy(ops)
    for op in out:
        if op["op"] == "replace":
            op["before"] = []
    return out


def _float_type(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "op": "replace",
            "path": f"/users/{USER}/payment_methods/gift_card_1/amount",
            "before": 120,
            "after": 100.0,
        }
    ]


def _spend_gift_card(state: dict[str, Any]) -> None:
    state["users"][USER]["payment_methods"]["gift_card_1"]["amount"] = 100


@pytest.mark.parametrize(
    ("change", "predict", "strict", "lenient"),
    [
        (_spend_gift_card, lambda ops: ops, True, True),
        (_spend_gift_card, _extra, False, True),  # an invented change passes lenient CM
        # 100.0 is not 100 for strict CM; EnvSimBench compares with Python's ==
        (_spend_gift_card, _float_type, False, True),
        (_spend_gift_card, lambda ops: [], False, False),
        (_spend_certificate, lambda ops: ops, True, False),  # a correct deletion fails lenient
        (_spend_certificate, _wrong_value, False, False),
        (_spend_certificate, _stale_before, False, False),  # (lenient fails on the remove anyway)
        (None, lambda ops: [], True, True),
        (None, _extra, False, True),
        (None, lambda ops: "not a list", False, True),  # lenient: no true op to miss
    ],
)
def test_config_match(change: Any, predict: Any, strict: bool, lenient: bool) -> None:
    sample = _sample(change)
    pred = predict(sample["delta"])
    assert config_match(pred, sample["state_before"], sample["state_after"]) is strict
    assert lenient_config_match(pred, sample["state_before"], sample["state_after"]) is lenient


def test_lenient_ignores_a_stale_before_that_strict_catches() -> None:
    sample = _sample(_spend_gift_card)
    pred = deepcopy(sample["delta"])
    pred[0]["before"] = 5
    assert not config_match(pred, sample["state_before"], sample["state_after"])
    assert lenient_config_match(pred, sample["state_before"], sample["state_after"])


@pytest.mark.parametrize(
    "pred",
    [
        [{"op": "replace", "path": "/users/nobody/name", "after": 1}],  # path does not exist
        [{"op": "add", "path": f"/users/{USER}", "after": {}}],  # add onto an existing key
        [{"op": "move", "path": "/users"}],
        [{"path": "/users"}],
        ["add /users"],
        [{"op": "replace", "path": "users", "after": {}}],  # not a pointer
        [{"op": "replace", "path": f"/users/{USER}/reservations/0", "after": "X"}],  # into a list
        None,
        {"op": "add"},
    ],
)
def test_unapplicable_predictions_are_misses_not_errors(pred: Any) -> None:
    sample = _sample(_spend_gift_card)
    assert config_match(pred, sample["state_before"], sample["state_after"]) is False
    assert lenient_config_match(pred, sample["state_before"], sample["state_after"]) is False


def test_config_match_does_not_touch_the_states() -> None:
    sample = _sample(_spend_certificate)
    before, after = deepcopy(sample["state_before"]), deepcopy(sample["state_after"])
    config_match(sample["delta"], sample["state_before"], sample["state_after"])
    assert sample["state_before"] == before and sample["state_after"] == after


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from([0.5, 1.0])
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
_STATES = st.dictionaries(st.sampled_from(["a", "b", "c/d", "e~"]), _JSON, max_size=4)


@settings(max_examples=150, deadline=None)
@given(_STATES, _STATES)
def test_the_true_delta_always_passes_strict_cm_and_lenient_only_without_removes(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    ops = diff(before, after)
    assert config_match(ops, before, after)
    has_remove = any(op["op"] == "remove" for op in ops)
    # EnvSimBench's dotted paths cannot name keys with a dot or empty keys
    assume(not any("." in key or not key for key in _keys(before) | _keys(after)))
    assert lenient_config_match(ops, before, after) is not has_remove


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_keys(v) for v in value.values()))
    return set()


# --- parsing predictions ----------------------------------------------------------------------


ANSWER = render_prediction('{"a": 1}', [{"op": "add", "path": "/x", "after": 1}])


@pytest.mark.parametrize(
    "text",
    [
        ANSWER,
        f"```json\n{ANSWER}\n```",
        f"<think>\nThe call succeeds.\n</think>\n\n{ANSWER}",
        ANSWER[:-1] + ",}",  # a trailing comma is repaired losslessly
        "  " + ANSWER + "\n",
    ],
)
def test_parse_prediction(text: str) -> None:
    pred = parse_prediction(text)
    assert pred == {
        "feedback": '{"a": 1}',
        "config_changes": [{"op": "add", "path": "/x", "after": 1}],
    }


def test_feedback_given_as_json_data_keeps_its_json_text() -> None:
    pred = parse_prediction('{"feedback": {"a": 1, "b": [true]}, "config_changes": []}')
    assert json.loads(pred["feedback"]) == {"a": 1, "b": [True]}
    assert feedback_match(pred["feedback"], '{"b": [true], "a": 1}')
    number = parse_prediction('{"feedback": 15.0, "config_changes": []}')
    assert feedback_match(number["feedback"], "15.0") and not feedback_match(
        number["feedback"], "15"
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The tool returns the user's profile.",
        '{"feedback": "x"}',  # no config_changes
        '{"config_changes": []}',  # no feedback
        '{"feedback": "x", "config_changes": {"op": "add"}}',
        '[{"feedback": "x", "config_changes": []}]',
        '{"feedback": "x", "config_c',  # truncated
        '<think>unfinished reasoning {"feedback": "x", "config_changes": []}',
        None,
    ],
)
def test_unparsable_predictions(text: Any) -> None:
    with pytest.raises(RepairError) as info:
        parse_prediction(text)
    assert info.value.reason == "unparsable_completion"


# --- prompts and alpaca rows ------------------------------------------------------------------


def test_simulation_messages_have_a_static_system_block() -> None:
    one = simulation_messages(_sample(), SPEC)
    other_sample = _sample(_spend_certificate, observation="Error: x")
    other_sample["tool"] = "cancel_reservation"
    other = simulation_messages(other_sample, {"name": "cancel_reservation", "parameters": {}})
    assert [m["role"] for m in one] == ["system", "user"]
    assert one[0]["content"] == other[0]["content"]  # byte-identical: cacheable prefix
    assert "book_reservation" not in one[0]["content"]
    user = one[1]["content"]
    assert user.index("### Tool") < user.index(STATE_MARKER) < user.index(SIM_MARKER)
    assert "x-kind" not in user
    call = json.loads(user.split(SIM_MARKER)[1].split("```json\n")[1].split("\n```")[0])
    assert call == {"name": "book_reservation", "arguments": {"user_id": USER}}
    state = json.loads(user.split(STATE_MARKER)[1].split("```json\n")[1].split("\n```")[0])
    assert state == STATE


def test_code_is_shown_only_when_given() -> None:
    without = simulation_messages(_sample(), SPEC)[1]["content"]
    code = "def book_reservation(data, user_id):\n    return 'ok'\n"
    with_code = simulation_messages(_sample(), SPEC, code)[1]["content"]
    assert "### Tool code" not in without and "```python" not in without
    assert "```python\ndef book_reservation(data, user_id):\n    return 'ok'\n```" in with_code


@pytest.mark.parametrize("reasoning", [None, "Ava pays by certificate, so it is removed."])
def test_to_alpaca(reasoning: str | None) -> None:
    sample = _sample(_spend_certificate)
    row = to_alpaca(sample, tool_spec=SPEC, reasoning=reasoning)
    assert set(row) == {"system", "instruction", "input", "output"}
    system, user = simulation_messages(sample, SPEC)
    # the simulator's instructions are the row's system prompt, as at inference
    assert row["system"] == system["content"] and system["content"] not in row["instruction"]
    assert user["content"] == row["instruction"] + "\n\n" + row["input"]
    assert '"name": "book_reservation"' in row["instruction"] and "x-kind" not in row["instruction"]
    assert row["input"].startswith(STATE_MARKER) and SIM_MARKER in row["input"]
    assert USER not in row["instruction"]  # the state goes in the input, never the instruction
    if reasoning:
        assert row["output"].startswith(f"<think>\n{reasoning}\n</think>\n\n")
    pred = parse_prediction(row["output"])
    assert pred["feedback"] == sample["observation"]
    assert config_match(pred["config_changes"], sample["state_before"], sample["state_after"])
    assert all(isinstance(v, str) for v in row.values())


def test_alpaca_with_code_puts_it_in_the_instruction() -> None:
    row = to_alpaca(_sample(), tool_spec=SPEC, code="def book_reservation(): ...")
    assert "### Tool code" in row["instruction"] and "### Tool code" not in row["input"]


# --- checking samples -------------------------------------------------------------------------


def test_check_sample_decodes_json_columns_and_fills_what_it_can() -> None:
    sample = _sample(_spend_gift_card)
    del sample["state_after"]
    record = {
        k: json.dumps(v) if k in ("arguments", "state_before", "delta") else v
        for k, v in sample.items()
    }
    checked = check_sample(record)
    assert checked["state_after"] == _after(_spend_gift_card)
    assert checked["labels"]["group"] == "Simple" and checked["labels"]["delta_size"] == 1
    assert isinstance(record["delta"], str)  # the record is not modified


def test_check_sample_keeps_given_labels() -> None:
    sample = dict(_sample(), labels={"group": "No-Change", "env_id": "w1", "task_id": None})
    labels = check_sample(sample)["labels"]
    assert labels["env_id"] == "w1" and labels["arg_cardinality"] == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("observation"), "observation"),
        (lambda s: s.update(arguments=[1]), "arguments"),
        (lambda s: s.update(delta="{not json"), "not JSON"),
        (lambda s: s.update(delta=[{"op": "remove", "path": "/nope"}]), "does not apply"),
        (lambda s: s.update(state_after={"users": {}}), "differs"),
    ],
)
def test_check_sample_refuses_what_cannot_be_scored(edit: Any, message: str) -> None:
    sample = _sample(_spend_gift_card)
    edit(sample)
    with pytest.raises(SampleError, match=message) as info:
        check_sample(sample)
    assert info.value.reason == "bad_step_sample"


def test_check_sample_refuses_a_non_object() -> None:
    with pytest.raises(SampleError):
        check_sample(["not", "a", "sample"])  # type: ignore[arg-type]


def test_apply_of_the_rendered_target_reproduces_state_after() -> None:
    sample = _sample(_spend_certificate)
    target = json.loads(to_alpaca(sample, tool_spec=SPEC)["output"])
    assert apply(target["config_changes"], sample["state_before"]) == sample["state_after"]
