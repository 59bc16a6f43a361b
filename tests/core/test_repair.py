from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.core.repair import (
    looks_like_json,
    parse_arguments,
    parse_json_value,
    parse_observation,
)
from factory.errors import RepairError

ACCEPTED: list[tuple[str, Any]] = [
    ('{"a": 1,}', {"a": 1}),
    ("[1, 2, 3,]", [1, 2, 3]),
    ("{'a': 'b'}", {"a": "b"}),
    ("{'a': 'it\\'s'}", {"a": "it's"}),
    ('{"a": True, "b": None, "c": False}', {"a": True, "b": None, "c": False}),
    ('{"a": {"b": 1}', {"a": {"b": 1}}),
    ('{"a": [1, 2', {"a": [1, 2]}),
    ('["x", {"k": "v"', ["x", {"k": "v"}]),
    ('{"a": "b"', {"a": "b"}),
    ("{a: 1, b_c: 'x'}", {"a": 1, "b_c": "x"}),
    ('{"a": "x" "b": 2}', {"a": "x", "b": 2}),
    ('{"text": "line1\nline2"}', {"text": "line1\nline2"}),
    ('{"a": "\\u00e9",}', {"a": "é"}),
    ('{"a": "x"}}', {"a": "x"}),
    ("```json\n{'a': 1,}\n```", {"a": 1}),
    ('{"amount": -12.5, "n": 3,}', {"amount": -12.5, "n": 3}),
    ("{'q': 'say \"hi\"',}", {"q": 'say "hi"'}),
    ('{"path": "a\\tb",}', {"path": "a\tb"}),
    ('{"nested": {"list": [{"k": "v",},],},}', {"nested": {"list": [{"k": "v"}]}}),
]

REFUSED = [
    "",
    "   \n ",
    "garbage",
    "hello world",
    "Error: flight not found",
    "True",
    "nul",
    '{"a": "hel',  # truncated inside a string
    '{"a": 1, "b"',  # truncated after a key
    '{"ab": 1, "a"',  # the lost key is a substring of another
    '{"a": 1, "b":',  # truncated after a colon
    "[1, 2,",  # truncated after a comma
    "{",
    "[",
    "{,}",
    '{"a": }',  # missing value: repair would invent ""
    '{"a" 1}',  # missing colon: repair would drop 1
    '{"a":1,,"b":2}',
    '{"a": tru',
    '{"a": undefined}',
    '{"a": NaN}',
    '{"a": 1e400}',
    '{"a": 1e}',
    '{"a": -}',
    '{"a": 1} trailing prose',
    'Sure! Here it is: {"a": 1}',
    '{"a":1}{"b":2}',  # two values glued into a list would be a guess
    '{"a": 1 // a comment\n}',
    '{"a": "x, "b": 2}',  # unbalanced quotes
    '{"a": "say "hi" now"}',
    "```json\n```",
    # json_repair decodes these escapes differently from JSON: refuse, never alter
    '{"url": "http:\\/\\/x.org"',
    '{"\\ud83d\\ude00": 1',
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_repair_accepts_lossless_fixes(text: str, expected: Any) -> None:
    value, repaired = parse_json_value(text)
    assert value == expected
    assert repaired


@pytest.mark.parametrize("text", REFUSED)
def test_repair_refuses_anything_it_would_have_to_guess(text: str) -> None:
    with pytest.raises(RepairError) as info:
        parse_json_value(text)
    assert info.value.reason == "invalid_json"


def test_valid_json_is_not_a_repair() -> None:
    assert parse_json_value('{"a": [1, {"b": null}]}') == ({"a": [1, {"b": None}]}, False)
    assert parse_json_value('"just a string"') == ("just a string", False)


def test_code_fence_alone_counts_as_repair() -> None:
    assert parse_json_value('```\n{"a": 1}\n```') == ({"a": 1}, True)


def test_refusal_message_is_short_and_carries_reason() -> None:
    text = '{"a": "' + "x" * 10_000
    with pytest.raises(RepairError) as info:
        parse_json_value(text, reason="malformed_arguments")
    assert info.value.reason == "malformed_arguments"
    assert len(str(info.value)) < 400


def test_deep_nesting_is_refused_not_crashing() -> None:
    with pytest.raises(RepairError):
        parse_json_value("[" * 100_000)
    with pytest.raises(RepairError):
        parse_json_value("[" * 100_000 + "]" * 100_000)


# --- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, "", "{}"])
def test_empty_arguments_are_legitimate(raw: Any) -> None:
    assert parse_arguments(raw) == ({}, [])


def test_dict_arguments_pass_through() -> None:
    args = {"reservation_id": "ABC123"}
    out, notes = parse_arguments(args)
    assert out is args and notes == []


@pytest.mark.parametrize(
    ("raw", "expected", "notes"),
    [
        ('{"user_id": "mia_li_3668"}', {"user_id": "mia_li_3668"}, []),
        ("{'user_id': 'mia_li_3668',}", {"user_id": "mia_li_3668"}, ["json_repair"]),
        ('"{\\"a\\": 1}"', {"a": 1}, ["double_encoded"]),
        ('```json\n{"a": 1}\n```', {"a": 1}, ["code_fence"]),
        ('{"flights": [{"n": "HAT1", "d": "2024-05-20"}', None, ["json_repair"]),
    ],
)
def test_arguments_parse_and_repair(raw: str, expected: Any, notes: list[str]) -> None:
    out, got = parse_arguments(raw)
    if expected is not None:
        assert out == expected
    assert got == notes


@pytest.mark.parametrize(
    "raw", ["   ", "garbage", '{"a": ', '{"user_id": "mia', "user_id=mia", "{,}"]
)
def test_unparsable_arguments_never_become_empty(raw: str) -> None:
    with pytest.raises(RepairError) as info:
        parse_arguments(raw)
    assert info.value.reason == "malformed_arguments"


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "42", "null", [1], 3.5, True])
def test_non_object_arguments(raw: Any) -> None:
    with pytest.raises(RepairError) as info:
        parse_arguments(raw)
    assert info.value.reason == "arguments_not_object"


# --- observations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Transfer successful",
        "Error: reservation not found",
        "255.0",
        "[INFO] done",
        "{not json at all}",
        '{"a": 1}',
        '[{"flight_number": "HAT069"}]',
        "[]",
    ],
)
def test_observation_kept_byte_for_byte(text: str) -> None:
    assert parse_observation(text) == (text, [])


def test_observation_repaired_and_reserialised() -> None:
    text, notes = parse_observation("{'status': 'ok', 'seats': [1, 2,]}")
    assert json.loads(text) == {"status": "ok", "seats": [1, 2]}
    assert notes == ["json_repair"]


@pytest.mark.parametrize("text", ['{"a": "trunc', '[{"a": 1}, {"b"', "{'a': undefined}"])
def test_malformed_observation(text: str) -> None:
    with pytest.raises(RepairError) as info:
        parse_observation(text)
    assert info.value.reason == "malformed_observation"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{a: 1}", True),
        ('  ["x"]', True),
        ("[1, 2", True),
        ('```json\n{"a": 1}\n```', True),
        ("[INFO] x", False),
        ("hi", False),
        ("```python\nprint(1)\n```", False),
    ],
)
def test_looks_like_json(text: str, expected: bool) -> None:
    assert looks_like_json(text) is expected


# --- properties ------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_valid_json_round_trips_unrepaired(value: Any) -> None:
    assert parse_json_value(json.dumps(value)) == (value, False)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_either_parses_or_refuses(text: str) -> None:
    with contextlib.suppress(RepairError):
        parse_json_value(text)
    try:
        parse_observation(text)
    except RepairError as exc:
        assert exc.reason == "malformed_observation"


plain_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='\\"'),
    max_size=8,
)
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers() | plain_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(plain_text, children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(plain_text.filter(bool), plain_values, min_size=1, max_size=4))
def test_missing_closing_brace_is_recovered_exactly(value: dict[str, Any]) -> None:
    text = json.dumps(value, ensure_ascii=False)
    got, repaired = parse_json_value(text[:-1])
    assert repaired and got == value


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), json_values, min_size=1, max_size=4))
def test_repair_never_alters_content(value: dict[str, Any]) -> None:
    """With any escapes, a repair gives exactly the original value or refuses."""
    text = json.dumps(value)
    try:
        got, _ = parse_json_value(text[:-1])
    except RepairError:
        return
    assert got == value
