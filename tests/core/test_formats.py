from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.core.formats import FORMATS, detect_format, hermes, openai_chat, parse_record, sharegpt
from factory.core.trajectory import Trajectory
from factory.errors import SeedError, SeedFormatError
from tests.conftest import ROOT as REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "seeds"
SEP = sharegpt.OBSERVATION_SEPARATOR


def load(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


TOOLS = load("openai")[0]["tools"]


def turns(traj: Trajectory) -> list[dict[str, Any]]:
    return [t.to_dict() for t in traj.turns]


def roles(traj: Trajectory) -> list[str]:
    return [t.role for t in traj.turns]


def conv(*pairs: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {"conversations": [{"from": f, "value": v} for f, v in pairs], **extra}


def msgs(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": list(messages), **extra}


def fc(*calls: tuple[str, Any]) -> str:
    items = [{"name": n, "arguments": a} for n, a in calls]
    return json.dumps(items[0] if len(items) == 1 else items)


# --- fixtures of every format ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt", "count"),
    [("sharegpt", "sharegpt", 2), ("openai", "openai", 1), ("hermes", "hermes", 2)],
)
def test_fixture_records_convert(name: str, fmt: str, count: int) -> None:
    records = load(name)
    assert len(records) == count
    for i, record in enumerate(records):
        traj = parse_record(record, source=f"{name}.json:{i}")
        assert detect_format(record) == fmt
        assert traj.metadata["format"] == fmt
        assert traj.metadata["source"] == f"{name}.json:{i}"
        assert traj.metadata["id"] == traj.content_id()
        assert isinstance(traj.metadata["repairs"], list)
        assert traj.tools and all(
            set(t) >= {"name", "description", "parameters"} for t in traj.tools
        )
        assert all("type" not in t for t in traj.tools)  # bare specs, not {"type": "function"}
        for turn in traj.turns:
            if turn.role == "tool":
                assert turn.name in traj.tool_names()
            for call in turn.tool_calls:
                assert isinstance(call.arguments, dict)


def test_sharegpt_apigen_record() -> None:
    traj = parse_record(load("sharegpt")[0], source="s:0")
    assert traj.system == "You are an airline agent. Follow the policy."
    assert roles(traj) == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert traj.turns[3].reasoning == "The user asked to cancel; confirm first."
    assert traj.turns[3].content == "Reservation ABC123 is active. Shall I cancel it?"
    parallel = traj.turns[5].tool_calls
    assert [c.name for c in parallel] == ["cancel_reservation", "get_user_details"]
    # one LLaMA-Factory observation split back into one tool turn per call
    assert traj.turns[6].to_dict() == {
        "role": "tool",
        "content": '{"status": "cancelled"}',
        "name": "cancel_reservation",
    }
    assert traj.turns[7].name == "get_user_details"
    assert traj.metadata["repairs"] == []


def test_sharegpt_json_list_observation_and_repair_note() -> None:
    traj = parse_record(load("sharegpt")[1], source="s:1")
    assert traj.system == "Airline agent."
    assert traj.turns[1].tool_calls[0].arguments == {}
    assert traj.turns[1].tool_calls[1].arguments == {"reservation_id": "XYZ789"}
    assert [t.content for t in traj.turns[2:4]] == [
        '{"JFK": "New York"}',
        "Error: reservation not found",
    ]
    assert traj.metadata["repairs"] == ["conversations[2].calls[1].arguments: json_repair"]
    assert traj.metadata["reward"] == 1.0 and traj.metadata["task_id"] == "apigen-17"


def test_sharegpt_one_observation_per_call_is_not_split() -> None:
    record = conv(
        ("human", "hi"),
        ("function_call", fc(("a", {}), ("b", {}))),
        ("observation", '["x", "y"]'),  # a list answering call a alone
        ("observation", "second"),
        ("gpt", "ok"),
    )
    traj = parse_record(record, source="x")
    assert [(t.name, t.content) for t in traj.turns[2:4]] == [("a", '["x", "y"]'), ("b", "second")]


def test_sharegpt_unsplittable_observation_answers_first_call() -> None:
    record = conv(
        ("human", "hi"), ("function_call", fc(("a", {}), ("b", {}))), ("observation", "only one")
    )
    traj = parse_record(record, source="x")
    assert [(t.role, t.name) for t in traj.turns[2:]] == [("tool", "a")]


def test_sharegpt_split_parts_are_repaired_individually() -> None:
    obs = "{'a': 1,}" + SEP + "plain"
    record = conv(("human", "q"), ("function_call", fc(("a", {}), ("b", {}))), ("observation", obs))
    traj = parse_record(record, source="x")
    assert [t.content for t in traj.turns[2:]] == ['{"a": 1}', "plain"]
    assert traj.metadata["repairs"] == ["conversations[2][0]: json_repair"]


def test_sharegpt_think_before_function_call_is_reasoning() -> None:
    value = "<think>need the user</think>" + fc(("get_user_details", {"user_id": "u1"}))
    traj = parse_record(conv(("human", "q"), ("function_call", value)), source="x")
    assert traj.turns[1].reasoning == "need the user"
    assert traj.turns[1].tool_calls[0].arguments == {"user_id": "u1"}


def test_sharegpt_function_call_value_may_already_be_an_object() -> None:
    value = {"name": "f", "arguments": '{"x": 1}'}
    traj = parse_record(conv(("human", "q"), ("function_call", value)), source="x")
    assert traj.turns[1].tool_calls[0].to_dict() == {"name": "f", "arguments": {"x": 1}}


def test_messages_stored_as_json_text_are_decoded() -> None:
    record = load("sharegpt")[0]
    as_text = {**record, "conversations": json.dumps(record["conversations"])}
    assert parse_record(as_text, source="x").id == parse_record(record, source="y").id


def test_openai_record_with_everything() -> None:
    traj = parse_record(load("openai")[0], source="o:0")
    assert traj.system == "You are an airline agent."
    assert traj.turns[0].content == "Cancel ABC123 please."  # list of text parts
    assert traj.turns[1].reasoning == "Look it up first."
    assert traj.turns[1].content == ""
    assert traj.turns[2].name == "get_reservation_details"  # filled from the call it answers
    assert traj.turns[3].reasoning == "Policy says confirm."
    # answered out of order: matched by tool_call_id
    assert [(t.tool_call_id, t.name) for t in traj.turns[6:8]] == [
        ("call_3", "list_all_airports"),
        ("call_2", "cancel_reservation"),
    ]
    assert traj.turns[5].tool_calls[1].arguments == {}
    assert {k: traj.metadata[k] for k in ("reward", "task_id", "trial", "user_id")} == {
        "reward": 1.0,
        "task_id": 7,
        "trial": 2,
        "user_id": "mia_li_3668",
    }


def test_openai_default_tools_only_when_record_has_none() -> None:
    record = msgs({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
    assert parse_record(record, source="x").tools == []
    traj = parse_record(record, source="x", default_tools=TOOLS)
    assert [t["name"] for t in traj.tools] == [t["function"]["name"] for t in TOOLS]
    own = {**record, "tools": [TOOLS[0]]}
    assert len(parse_record(own, source="x", default_tools=TOOLS).tools) == 1


def test_openai_legacy_function_call_and_traj_key() -> None:
    record = {
        "traj": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "f", "arguments": "{}"},
            },
            {"role": "function", "name": "f", "content": "done"},
            {"role": "assistant", "content": "ok", "reasoning": "r"},
        ]
    }
    traj = parse_record(record, source="x")
    assert traj.turns[1].tool_calls[0].name == "f"
    assert traj.turns[2].to_dict() == {"role": "tool", "content": "done", "name": "f"}
    assert traj.turns[3].reasoning == "r"


def test_parquet_style_nulls_are_absent_fields() -> None:
    record = msgs(
        {"role": "user", "content": "q", "tool_calls": None, "name": None, "tool_call_id": None},
        {"role": "assistant", "content": "a", "tool_calls": None, "reasoning_content": None},
    )
    assert roles(parse_record(record, source="x")) == ["user", "assistant"]


def test_hermes_sharegpt_layout() -> None:
    traj = parse_record(load("hermes")[0], source="h:0")
    assert [t["name"] for t in traj.tools] == [
        "get_reservation_details",
        "cancel_reservation",
        "get_user_details",
    ]
    assert traj.turns[1].content == "Let me check both."
    assert traj.turns[1].reasoning == "Two lookups."
    assert [c.arguments for c in traj.turns[1].tool_calls] == [
        {"reservation_id": "ABC123"},
        {"user_id": "mia_li_3668"},
    ]
    # hermes-v1 {"name", "content"} responses are unwrapped
    assert [(t.name, t.content) for t in traj.turns[2:4]] == [
        ("get_reservation_details", '{"status": "active"}'),
        ("get_user_details", '{"membership": "gold"}'),
    ]
    assert traj.metadata["repairs"] == ["conversations[2].tool_call[1]: json_repair"]


def test_hermes_openai_layout_user_tool_responses() -> None:
    traj = parse_record(load("hermes")[1], source="h:1")
    assert roles(traj) == ["user", "assistant", "tool", "assistant"]
    assert traj.turns[2].to_dict() == {
        "role": "tool",
        "content": "Error: reservation already cancelled",
        "name": "cancel_reservation",
    }


def test_hermes_unclosed_final_tool_call_is_noted() -> None:
    record = msgs(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}'},
    )
    traj = parse_record(record, source="x")
    assert traj.turns[1].tool_calls[0].arguments == {"a": 1}
    assert traj.metadata["repairs"] == ["messages[1].tool_call[0]: unclosed_tool_call"]


def test_structured_calls_win_over_text_markup() -> None:
    record = conv(
        ("human", "q"), ("gpt", "<tool_call>x</tool_call>"), ("function_call", fc(("f", {})))
    )
    assert detect_format(record) == "sharegpt"


@pytest.mark.parametrize(
    ("record", "fmt"),
    [
        (conv(("human", "q"), ("gpt", "a")), "sharegpt"),
        ({"messages": [{"from": "human", "value": "q"}]}, "sharegpt"),
        ({"conversations": [{"role": "user", "content": "q"}]}, "openai"),
        (msgs({"role": "user", "content": "<tool_response>x</tool_response>"}), "hermes"),
        (conv(("human", "q"), ("gpt", "<tool_call>{}</tool_call>")), "hermes"),
    ],
)
def test_detect_format(record: dict[str, Any], fmt: str) -> None:
    assert detect_format(record) == fmt


def test_format_modules_are_registered() -> None:
    assert {
        "sharegpt": sharegpt.parse,
        "openai": openai_chat.parse,
        "hermes": hermes.parse,
    } == FORMATS


@pytest.mark.parametrize("name", ["sharegpt", "openai", "hermes"])
def test_round_trip_canonical(name: str) -> None:
    for i, record in enumerate(load(name)):
        traj = parse_record(record, source=f"{name}:{i}")
        assert Trajectory.from_dict(traj.to_dict()) == traj
        assert Trajectory.from_json(traj.to_json()) == traj
        assert Trajectory.from_json(traj.to_json()).content_id() == traj.metadata["id"]


def test_same_conversation_in_two_formats_has_one_id() -> None:
    a = parse_record(
        conv(
            ("human", "q"),
            ("function_call", fc(("f", {"x": 1}))),
            ("observation", "r"),
            ("gpt", "a"),
        ),
        source="a",
    )
    b = parse_record(
        msgs(
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}],
            },
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "a"},
        ),
        source="b",
    )
    assert a.id == b.id and a.metadata["format"] != b.metadata["format"]


def test_input_record_is_not_mutated() -> None:
    record = load("openai")[0]
    before = copy.deepcopy(record)
    parse_record(record, source="x")
    assert record == before


# --- every reason code -----------------------------------------------------------------

DEEP: Any = "x"
for _ in range(80):
    DEEP = [DEEP]

BAD: list[tuple[str, Any]] = [
    ("not_an_object", [1, 2]),
    ("not_an_object", "a string"),
    ("not_an_object", None),
    ("unknown_format", {"prompt": "q", "completion": "a"}),
    ("unknown_format", {"messages": [{"speaker": "user", "text": "q"}]}),
    ("bad_role", conv(("human", "q"), ("bot", "a"))),
    ("bad_role", msgs({"role": "user", "content": "q"}, {"role": "narrator", "content": "x"})),
    ("bad_role", msgs({"role": "user", "content": "q"}, {"role": "system", "content": "late"})),
    ("bad_role", conv(("human", "q"), ("system", "late"))),
    ("bad_role", {"messages": [{"from": "human", "value": "q"}, {"from": 3, "value": "x"}]}),
    ("bad_field_type", conv(("human", 42))),
    ("bad_field_type", {"conversations": "not json"}),
    ("bad_field_type", {"conversations": {"from": "human"}}),
    ("bad_field_type", {"conversations": [["human", "q"]]}),
    ("bad_field_type", msgs({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})),
    (
        "bad_field_type",
        msgs({"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": "f"}),
    ),
    (
        "bad_field_type",
        msgs(
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
        ),
    ),
    (
        "bad_field_type",
        msgs(
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"name": "f", "id": 5}]},
        ),
    ),
    (
        "bad_field_type",
        msgs({"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": 1}),
    ),
    ("bad_field_type", conv(("human", "q"), ("function_call", "[]"))),
    ("bad_field_type", conv(("human", "q"), ("function_call", '["f"]'))),
    (
        "bad_field_type",
        msgs({"role": "user", "content": "<tool_response>r</tool_response> and more"}),
    ),
    ("bad_field_type", {**conv(("human", "q")), "system": ["s"]}),
    ("bad_field_type", {**conv(("human", "q")), "reward": {"value": 1}}),
    ("bad_tools", {**conv(("human", "q")), "tools": "[{'name': "}),
    ("bad_tools", {**conv(("human", "q")), "tools": 5}),
    ("bad_tools", {**conv(("human", "q")), "tools": [{"description": "no name"}]}),
    ("bad_tools", {**conv(("human", "q")), "tools": [{"name": "f", "parameters": "x"}]}),
    ("bad_tools", {**conv(("human", "q")), "tools": [{"name": "f"}, {"name": "f"}]}),
    (
        "bad_tools",
        conv(
            ("system", "<tools>\n{'name': 'f'}\nnot json\n</tools>"),
            ("human", "q"),
            ("gpt", '<tool_call>{"name": "f"}</tool_call>'),
        ),
    ),
    ("empty_trajectory", {"messages": []}),
    ("empty_trajectory", {"conversations": [{"from": "system", "value": "s"}]}),
    ("empty_trajectory", msgs({"role": "tool", "content": "r"})),
    ("too_large", {"messages": [{"role": "user", "content": "x" * 2_100_000}]}),
    ("too_large", {"messages": DEEP}),
    (
        "malformed_arguments",
        conv(("human", "q"), ("function_call", '{"name": "f", "arguments": {"a": "tru')),
    ),
    ("malformed_arguments", conv(("human", "q"), ("function_call", fc(("f", "garbage"))))),
    (
        "malformed_arguments",
        msgs(
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": "{'a': "}}],
            },
        ),
    ),
    (
        "malformed_arguments",
        msgs(
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<tool_call>not json</tool_call>"},
        ),
    ),
    ("arguments_not_object", conv(("human", "q"), ("function_call", fc(("f", "[1, 2]"))))),
    ("arguments_not_object", conv(("human", "q"), ("function_call", fc(("f", 7))))),
    (
        "malformed_observation",
        conv(("human", "q"), ("function_call", fc(("f", {}))), ("observation", '{"seats": [1, 2,')),
    ),
    (
        "malformed_observation",
        msgs({"role": "user", "content": "q"}, {"role": "tool", "content": "{'a': undefined}"}),
    ),
]


@pytest.mark.parametrize(
    ("reason", "record"), BAD, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD)]
)
def test_reason_codes(reason: str, record: Any) -> None:
    with pytest.raises(SeedFormatError) as info:
        parse_record(record, source="bad.jsonl:3")
    assert info.value.reason == reason
    assert info.value.row_id == "bad.jsonl:3"
    assert len(str(info.value)) < 600


def test_limits_are_overridable() -> None:
    record = load("openai")[0]
    with pytest.raises(SeedError) as info:
        parse_record(record, source="x", max_bytes=500)
    assert info.value.reason == "too_large"
    with pytest.raises(SeedError):
        parse_record(record, source="x", max_depth=3)
    parse_record({"messages": [{"role": "user", "content": "q"}]}, source="x", max_depth=3)


def test_huge_nesting_never_raises_recursion_error() -> None:
    deep: Any = {}
    for _ in range(50_000):
        deep = {"a": deep}
    with pytest.raises(SeedError) as info:
        parse_record({"messages": [{"role": "user", "content": "q", "extra": deep}]}, source="x")
    assert info.value.reason == "too_large"


def test_unparsable_arguments_never_become_empty() -> None:
    record = msgs(
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "  "}}]},
    )
    with pytest.raises(SeedError) as info:
        parse_record(record, source="x")
    assert info.value.reason == "malformed_arguments"


# --- property: only SeedError escapes --------------------------------------------------

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
)
json_like = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=15,
)
role_values = st.sampled_from(
    ["human", "gpt", "function_call", "observation", "system", "tool", "user", "assistant", "x"]
)
texts = st.sampled_from(
    [
        "hi",
        "",
        "<think>r</think>ok",
        '{"name": "f", "arguments": {"a": 1}}',
        '[{"name": "f", "arguments": "{}"}, {"name": "g"}]',
        "<tool_call>{'name': 'f', 'arguments': {}}</tool_call>",
        '<tool_response>{"a": 1}</tool_response>',
        "{'a': 1,",
        "a" + SEP + "b",
        "[1, 2]",
    ]
) | st.text(max_size=30)
message = st.fixed_dictionaries(
    {},
    optional={
        "from": role_values,
        "role": role_values,
        "value": texts | json_like,
        "content": texts | json_like,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "id": st.sampled_from(["c1", "c2"]) | json_like,
                    "function": st.fixed_dictionaries(
                        {},
                        optional={
                            "name": st.sampled_from(["f", "g"]) | json_like,
                            "arguments": texts | json_like,
                        },
                    ),
                },
            ),
            max_size=3,
        )
        | json_like,
        "tool_call_id": st.sampled_from(["c1", "c2"]) | json_like,
        "name": st.sampled_from(["f", "g"]) | json_like,
    },
)
names = st.sampled_from(["f", "g"])
call_ids = st.sampled_from(["c1", "c2"])
sharegpt_message = st.fixed_dictionaries(
    {"from": st.sampled_from(["human", "gpt", "function_call", "observation"]), "value": texts}
)
openai_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": texts | st.none()},
    optional={
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": call_ids,
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries({"name": names, "arguments": texts}),
                }
            ),
            max_size=3,
        ),
        "tool_call_id": call_ids,
        "name": names,
        "reasoning_content": texts,
    },
)
plausible = st.fixed_dictionaries(
    {"conversations": st.lists(sharegpt_message, min_size=1, max_size=8)},
    optional={"tools": st.just(TOOLS), "system": texts},
) | st.fixed_dictionaries(
    {"messages": st.lists(openai_message, min_size=1, max_size=8)},
    optional={"tools": st.just(json.dumps(TOOLS)), "reward": st.floats(0, 1)},
)
records = (
    plausible
    | st.fixed_dictionaries(
        {},
        optional={
            "conversations": st.lists(message, max_size=6) | json_like,
            "messages": st.lists(message, max_size=6) | json_like,
            "traj": st.lists(message, max_size=6),
            "tools": st.sampled_from([TOOLS, json.dumps(TOOLS), "[", [{"name": "f"}]]) | json_like,
            "system": texts | json_like,
            "reward": json_like,
            "info": json_like,
        },
    )
    | json_like
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_parse_record_raises_only_seed_errors(record: Any) -> None:
    try:
        traj = parse_record(record, source="h:0")
    except SeedError as exc:
        assert exc.reason in __import__("factory.core.reasons", fromlist=["REASONS"]).REASONS
        return
    assert traj.metadata["id"] == traj.content_id()
    assert Trajectory.from_json(traj.to_json()) == traj


# --- the documented layouts (docs/seed-formats.md) ------------------------------------------
def _documented() -> list[Any]:
    text = (REPO_ROOT / "docs" / "seed-formats.md").read_text(encoding="utf-8")
    blocks = text.split("```json\n")[1:]
    return [json.loads(block.split("\n```", 1)[0]) for block in blocks]


def test_every_documented_seed_layout_parses_with_its_call_and_answer() -> None:
    from factory.core.trajectory import normalize_tool_spec

    documented = _documented()
    records = [r for r in documented if any(k in r for k in ("conversations", "messages", "traj"))]
    specs = [r for r in documented if r not in records]
    assert [detect_format(r) for r in records] == ["sharegpt", "openai", "openai", "hermes"]
    domain_tools = [normalize_tool_spec(s) for s in specs[:1]]
    for record in records:
        traj = parse_record(record, source="doc:0", default_tools=domain_tools)
        (_, call), *_ = traj.calls()
        assert call.name == "get_member_details" and call.arguments == {"member_id": "M0007"}
        assert [t.role for t in traj.turns][-2:] == ["tool", "assistant"]
        assert traj.system.startswith("You are a library assistant.")
        assert traj.tools
    bare, wrapped = (normalize_tool_spec(s) for s in specs)
    assert bare == wrapped and bare["name"] == "checkout_book"
