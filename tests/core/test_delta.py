from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.core.delta import DeltaError, apply, diff, escape, invert, pointer, same_json, split

# --- strategies ---------------------------------------------------------------------------

KEYS = st.text(alphabet="ab/~0 1é", min_size=0, max_size=4)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
STATES = st.dictionaries(KEYS, JSON, max_size=5)


@st.composite
def edited(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with random removals, replacements, additions and nested edits."""
    if not isinstance(value, dict):
        return draw(JSON) if draw(st.booleans()) else copy.deepcopy(value)
    out: dict[str, Any] = {}
    for key, child in value.items():
        action = draw(st.sampled_from(["keep", "drop", "edit", "recurse"]))
        if action == "keep":
            out[key] = copy.deepcopy(child)
        elif action == "edit":
            out[key] = draw(JSON)
        elif action == "recurse":
            out[key] = draw(edited(child))
    for key in draw(st.lists(KEYS, max_size=2)):
        out.setdefault(key, draw(JSON))
    return out


@st.composite
def state_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    before = draw(STATES)
    return before, draw(edited(before)) if draw(st.booleans()) else draw(STATES)


# --- properties ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(state_pairs())
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_apply_diff_reproduces_target_without_touching_input(pair: tuple[Any, Any]) -> None:
    before, after = pair
    pristine = copy.deepcopy(before)
    ops = diff(before, after)
    result = apply(ops, before)
    assert same_json(result, after)
    assert same_json(before, pristine)
    assert (ops == []) == same_json(before, after)


@settings(max_examples=150, deadline=None)
@given(state_pairs())
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_invert_undoes_a_delta(pair: tuple[Any, Any]) -> None:
    before, after = pair
    ops = diff(before, after)
    assert same_json(apply(invert(ops), after), before)
    assert len(diff(after, before)) == len(ops)  # |Δ| is symmetric


@settings(max_examples=100, deadline=None)
@given(STATES)
def test_diff_of_equal_states_is_empty(state: dict[str, Any]) -> None:
    assert diff(state, copy.deepcopy(state)) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(KEYS, max_size=4))
def test_pointer_round_trip(parts: list[str]) -> None:
    assert split(pointer(parts)) == parts


# --- granularity and exactness ------------------------------------------------------------


def test_lists_are_whole_values() -> None:
    ops = diff({"u": {"r": ["A"]}}, {"u": {"r": ["A", "B"]}})
    assert ops == [{"op": "replace", "path": "/u/r", "before": ["A"], "after": ["A", "B"]}]


@pytest.mark.parametrize(("a", "b"), [(1, 1.0), (1, True), (0, False), (None, 0), ("1", 1)])
def test_json_types_are_distinguished(a: Any, b: Any) -> None:
    ops = diff({"k": a}, {"k": b})
    assert ops == [{"op": "replace", "path": "/k", "before": a, "after": b}]
    assert type(apply(ops, {"k": a})["k"]) is type(b)


def test_ops_have_only_meaningful_values() -> None:
    ops = diff({"gone": None, "same": 1}, {"same": 1, "new": None})
    assert ops == [
        {"op": "remove", "path": "/gone", "before": None},
        {"op": "add", "path": "/new", "after": None},
    ]


def test_rfc6901_escaping() -> None:
    assert escape("a/b~c") == "a~1b~0c"
    ops = diff({"a/b": {"~": 1}}, {"a/b": {"~": 2}})
    assert ops[0]["path"] == "/a~1b/~0"
    assert apply(ops, {"a/b": {"~": 1}}) == {"a/b": {"~": 2}}


def test_root_replacement_when_types_differ() -> None:
    assert diff([1], {"a": 1}) == [{"op": "replace", "path": "", "before": [1], "after": {"a": 1}}]
    assert apply(diff([1], {"a": 1}), [1]) == {"a": 1}


def test_diff_skips_shared_objects_and_copies_values() -> None:
    shared = {"big": list(range(100))}
    before = {"x": shared, "y": {"v": [1]}}
    after = {"x": shared, "y": {"v": [1, 2]}}
    ops = diff(before, after)
    assert [op["path"] for op in ops] == ["/y/v"]
    after["y"]["v"].append(3)  # ops must not alias the states
    assert ops[0]["after"] == [1, 2]


def test_apply_shares_untouched_subtrees_only() -> None:
    before = {"users": {"a": {"n": 1}, "b": {"n": 2}}}
    result = apply([{"op": "replace", "path": "/users/a/n", "before": 1, "after": 5}], before)
    assert result["users"]["b"] is before["users"]["b"]
    assert result["users"]["a"] is not before["users"]["a"]
    assert before["users"]["a"]["n"] == 1


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "add", "path": "/a", "after": 1}, "already exists"),
        ({"op": "remove", "path": "/zz", "before": 1}, "does not exist"),
        ({"op": "replace", "path": "/zz/q", "before": 1, "after": 2}, "/zz does not exist"),
        ({"op": "replace", "path": "/a", "before": 2, "after": 3}, "'before' does not match"),
        ({"op": "replace", "path": "/a", "before": 1.0, "after": 3}, "'before' does not match"),
        ({"op": "replace", "path": "/l/0", "before": 1, "after": 3}, "/l is not an object"),
        ({"op": "move", "path": "/a"}, "not an add/remove/replace op"),
        ({"op": "add", "path": "/b"}, "no 'after' value"),
        ({"op": "add", "path": "a", "after": 1}, "not a JSON pointer"),
        ({"op": "remove", "path": ""}, "document root"),
        ("nonsense", "not an add/remove/replace op"),
    ],
)
def test_apply_rejects_bad_ops(op: Any, message: str) -> None:
    state = {"a": 1, "l": [1]}
    with pytest.raises(DeltaError, match=message):
        apply([op], state)
    assert state == {"a": 1, "l": [1]}


def test_non_string_keys_are_rejected() -> None:
    with pytest.raises(DeltaError, match="not a string"):
        diff({1: "a"}, {1: "b"})


def test_invert_needs_values() -> None:
    with pytest.raises(DeltaError, match="cannot be inverted"):
        invert([{"op": "replace", "path": "/a", "after": 1}])
