"""Normalisation, sharegpt rendering and the structure check, against LLaMA-Factory's rules.

``lf_accepts`` and ``lf_parse_function_call`` re-implement, from the facts of
LLaMA-Factory's ``SharegptDatasetConverter`` / supervised processor and its
``FunctionFormatter``, what it does with a row: every export must survive them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.core.export import (
    OBSERVATION_SEPARATOR,
    check_structure,
    export_tools,
    normalize,
    render,
    render_conversations,
    to_sharegpt,
)
from factory.core.reasons import REASONS
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.core.validate import validate

# --- LLaMA-Factory, re-implemented from its documented behaviour ------------------------------
_LF_THOUGHT = re.compile(re.escape("<think>\n") + "(.*?)" + re.escape("\n</think>\n\n"), re.DOTALL)


def lf_accepts(row: dict[str, Any]) -> bool:
    """SharegptDatasetConverter's alignment check plus the processor's non-empty check."""
    messages = row["conversations"]
    if messages and messages[0]["from"] == "system":
        messages = messages[1:]
    accept = (("human", "observation"), ("gpt", "function_call"))
    for index, message in enumerate(messages):
        if message["from"] not in accept[index % 2]:
            return False  # "Invalid role tag"
    if len(messages) % 2 != 0:
        return False  # "Invalid message count"
    prompt, response = messages[:-1], messages[-1:]
    return len(prompt) % 2 == 1 and len(response) == 1  # else "Dropped invalid example"


def lf_parse_function_call(value: str) -> tuple[str | None, list[tuple[str, str]]]:
    """FunctionFormatter.apply: cut the thought, parse the JSON, return (thought, calls)."""
    thought = _LF_THOUGHT.search(value)
    if thought:
        value = value.replace(thought.group(0), "")
    calls = json.loads(value)
    if not isinstance(calls, list):
        calls = [calls]
    parsed = [(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls]
    return (thought.group(0) if thought else None), parsed


# --- builders ---------------------------------------------------------------------------------
TOOLS = [
    {
        "name": "get_reservation_details",
        "description": "Look a reservation up.",
        "x-kind": "read",
        "parameters": {
            "type": "object",
            "properties": {"reservation_id": {"type": "string"}},
            "required": ["reservation_id"],
        },
    },
    {
        "type": "function",
        "function": {
            "name": "transfer_to_human_agents",
            "description": "Hand over.",
            "parameters": {
                "type": "object",
                "properties": {"summary": {"type": "string"}},
                "required": ["summary"],
            },
        },
    },
]


def user(text: str) -> Turn:
    return Turn(role="user", content=text)


def asst(text: str = "", *calls: ToolCall, reasoning: str | None = None) -> Turn:
    return Turn(role="assistant", content=text, tool_calls=list(calls), reasoning=reasoning)


def tool(text: str, name: str = "get_reservation_details") -> Turn:
    return Turn(role="tool", content=text, name=name)


def call(rid: str = "ZFA04Y") -> ToolCall:
    return ToolCall("get_reservation_details", {"reservation_id": rid})


def transfer() -> ToolCall:
    return ToolCall("transfer_to_human_agents", {"summary": "wants a refund"})


def traj(*turns: Turn) -> Trajectory:
    return Trajectory(system="Policy.", tools=TOOLS, turns=list(turns), metadata={"id": "t1"})


def tags(row: dict[str, Any]) -> list[str]:
    return [m["from"] for m in row["conversations"]]


# --- normalize --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("turns", "expected", "repairs"),
    [
        pytest.param(
            [user("hi"), user("there"), asst("hello")],
            [user("hi\n\nthere"), asst("hello")],
            1,
            id="merge-users",
        ),
        pytest.param(
            [user("hi"), asst("a", reasoning="r1"), asst("b", reasoning="r2")],
            [user("hi"), asst("a\n\nb", reasoning="r1\n\nr2")],
            1,
            id="merge-assistant-texts",
        ),
        pytest.param(
            [user("hi"), asst("Let me look.", call()), tool("{}"), asst("done")],
            [user("hi"), asst("", call(), reasoning="Let me look."), tool("{}"), asst("done")],
            1,
            id="text-with-call-to-reasoning",
        ),
        pytest.param(
            [user("hi"), asst("Let me look.", call(), reasoning="think"), tool("{}"), asst("ok")],
            [
                user("hi"),
                asst("", call(), reasoning="think\n\nLet me look."),
                tool("{}"),
                asst("ok"),
            ],
            1,
            id="text-after-existing-reasoning",
        ),
        pytest.param(
            [user("hi"), asst("Checking."), asst("", call()), tool("{}"), asst("ok")],
            [user("hi"), asst("", call(), reasoning="Checking."), tool("{}"), asst("ok")],
            1,
            id="text-turn-before-call-turn",
        ),
        pytest.param(
            [user("hi"), asst("   ", reasoning="hmm"), asst("hello")],
            [user("hi"), asst("hello")],
            1,
            id="drop-empty-assistant",
        ),
        pytest.param(
            [user("hi"), asst("  ", call()), tool("{}"), asst("ok")],
            [user("hi"), asst("", call()), tool("{}"), asst("ok")],
            1,
            id="clear-whitespace-text",
        ),
        pytest.param(
            [user("hi"), asst("bye"), user("###STOP###")],
            [user("hi"), asst("bye")],
            1,
            id="drop-trailing-stop",
        ),
        pytest.param(
            [user("hi"), asst("", transfer()), tool("Transfer successful", "t")],
            [user("hi"), asst("", transfer())],
            1,
            id="drop-trailing-observation",
        ),
        pytest.param(
            [user("hi"), asst("", transfer()), tool("ok", "t"), user("thanks"), user("###STOP###")],
            [user("hi"), asst("", transfer())],
            3,
            id="drop-trailing-everything",
        ),
        pytest.param(
            [user("a"), user("")],
            [],
            2,
            id="only-users-becomes-empty",
        ),
        pytest.param(
            [user("hi"), asst("", call()), tool("1"), asst("", call("B")), tool("2"), asst("x")],
            [user("hi"), asst("", call()), tool("1"), asst("", call("B")), tool("2"), asst("x")],
            0,
            id="already-clean",
        ),
    ],
)
def test_normalize(turns: list[Turn], expected: list[Turn], repairs: int) -> None:
    original = traj(*turns)
    before = original.to_json()
    out = normalize(original)
    assert out.turns == expected
    assert len(out.metadata.get("repairs", [])) == repairs
    assert original.to_json() == before, "normalize must not modify its input"
    assert all(r.startswith("normalize: ") for r in out.metadata.get("repairs", []))


def test_normalize_is_idempotent_and_keeps_metadata() -> None:
    t = traj(user("a"), user("b"), asst("x", call()), tool("{}"), user("###STOP###"))
    t.metadata["repairs"] = ["earlier: repaired arguments"]
    once = normalize(t)
    twice = normalize(once)
    assert twice.turns == once.turns
    assert twice.metadata["repairs"] == once.metadata["repairs"]
    assert once.metadata["repairs"][0] == "earlier: repaired arguments"
    assert t.metadata["repairs"] == ["earlier: repaired arguments"]
    assert once.metadata["id"] == "t1"


# --- to_sharegpt ------------------------------------------------------------------------------
def test_tau_bench_shape_exports_cleanly() -> None:
    """Text next to a call, a transfer observation and a ###STOP### at the end."""
    t = traj(
        user("I want to cancel ZFA04Y."),
        asst("Let me check that reservation.", call()),
        tool('{"reservation_id": "ZFA04Y", "status": "active"}'),
        asst("It is active. Shall I transfer you?"),
        user("Yes."),
        asst("", transfer()),
        tool("Transfer successful", "transfer_to_human_agents"),
        user("###STOP###"),
    )
    row = to_sharegpt(normalize(t))
    assert set(row) == {"conversations", "system", "tools"}
    assert tags(row) == ["human", "function_call", "observation", "gpt", "human", "function_call"]
    assert row["system"] == "Policy."
    assert check_structure(row["conversations"]) == []
    assert lf_accepts(row)
    thought, calls = lf_parse_function_call(row["conversations"][1]["value"])
    assert thought == "<think>\nLet me check that reservation.\n</think>\n\n"
    assert calls == [("get_reservation_details", '{"reservation_id": "ZFA04Y"}')]
    assert validate(t) == []


def test_function_call_value_is_name_and_arguments_json() -> None:
    row = to_sharegpt(traj(user("q"), asst("", ToolCall("f", {"city": "Zürich"}, id="c1"))))
    value = row["conversations"][1]["value"]
    assert json.loads(value) == {"name": "f", "arguments": {"city": "Zürich"}}
    assert "Zürich" in value  # ensure_ascii=False, as LLaMA-Factory writes it


def test_parallel_calls_are_a_list_and_results_one_observation() -> None:
    t = traj(
        user("two please"),
        asst("", call("AAAAAA"), call("BBBBBB")),
        tool("first"),
        tool("second"),
        asst("Both found."),
    )
    row = to_sharegpt(t)
    assert tags(row) == ["human", "function_call", "observation", "gpt"]
    parsed = json.loads(row["conversations"][1]["value"])
    assert [c["arguments"]["reservation_id"] for c in parsed] == ["AAAAAA", "BBBBBB"]
    assert row["conversations"][2]["value"] == "first" + OBSERVATION_SEPARATOR + "second"
    assert row["conversations"][2]["value"] == "first\n</tool_response>\n<tool_response>\nsecond"
    assert check_structure(row["conversations"]) == []
    assert lf_accepts(row)


def test_single_result_stays_as_is() -> None:
    row = to_sharegpt(traj(user("q"), asst("", call()), tool('{"a": 1}'), asst("ok")))
    assert row["conversations"][2] == {"from": "observation", "value": '{"a": 1}'}


@pytest.mark.parametrize(
    ("mode", "gpt_value", "call_prefix"),
    [
        ("keep", "<think>\nwhy\n</think>\n\nanswer", "<think>\nplan\n</think>\n\n"),
        ("strip", "answer", ""),
    ],
)
def test_reasoning_modes(mode: str, gpt_value: str, call_prefix: str) -> None:
    t = traj(
        user("q"), asst("", call(), reasoning="plan"), tool("r"), asst("answer", reasoning="why")
    )
    row = to_sharegpt(t, reasoning=mode)  # type: ignore[arg-type]
    assert row["conversations"][3]["value"] == gpt_value
    value = row["conversations"][1]["value"]
    assert value.startswith(call_prefix + "{")
    thought, calls = lf_parse_function_call(value)
    assert thought == (call_prefix or None)
    assert calls == [("get_reservation_details", '{"reservation_id": "ZFA04Y"}')]


def test_unknown_reasoning_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="keep"):
        to_sharegpt(traj(user("q"), asst("a")), reasoning="drop")  # type: ignore[arg-type]


def test_tools_are_bare_specs_without_x_keys() -> None:
    spec = {
        "name": "f",
        "description": "d",
        "x-kind": "write",
        "parameters": {
            "type": "object",
            "x-note": "internal",
            "properties": {
                "x-trace": {"type": "string", "x-hint": 1},
                "items": {"type": "array", "items": {"type": "object", "x-a": 1, "properties": {}}},
                "either": {"anyOf": [{"type": "string", "x-b": 2}, {"type": "null"}]},
            },
            "required": ["x-trace"],
        },
    }
    tools = json.loads(export_tools([spec, {"type": "function", "function": {"name": "g"}}]))
    assert tools[0] == {
        "name": "f",
        "description": "d",
        "parameters": {
            "type": "object",
            "properties": {
                "x-trace": {"type": "string"},  # an argument's *name* is kept
                "items": {"type": "array", "items": {"type": "object", "properties": {}}},
                "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["x-trace"],
        },
    }
    assert tools[1] == {
        "name": "g",
        "description": "",
        "parameters": {"type": "object", "properties": {}},
    }
    assert spec["x-kind"] == "write", "export must not modify the spec"
    assert json.loads(to_sharegpt(traj(user("q"), asst("a")))["tools"])[1]["name"] == (
        "transfer_to_human_agents"
    )


def test_unnormalised_text_and_call_is_rendered_not_dropped() -> None:
    conversations, where = render_conversations(traj(user("q"), asst("say", call())))
    assert [m["from"] for m in conversations] == ["human", "gpt", "function_call"]
    assert where == [0, 1, 1]
    assert [i.code for i in check_structure(conversations)] == [
        "bad_turn_order",
        "no_assistant_ending",
    ]


# --- check_structure --------------------------------------------------------------------------
def _c(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"from": tag, "value": value} for tag, value in pairs]


CALL = json.dumps({"name": "f", "arguments": {}})
TWO_CALLS = json.dumps([{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}])

STRUCTURE_CASES = [
    pytest.param("empty_trajectory", [], id="empty"),
    pytest.param("empty_trajectory", _c(("system", "s")), id="system-only"),
    pytest.param("bad_field_type", [{"from": "human", "value": 3}, *_c(("gpt", "a"))], id="type"),
    pytest.param("bad_turn_order", _c(("gpt", "a"), ("human", "b")), id="starts-with-gpt"),
    pytest.param("bad_turn_order", _c(("human", "a"), ("human", "b")), id="two-humans"),
    pytest.param("bad_turn_order", _c(("human", "a"), ("tool", "b")), id="unknown-tag"),
    pytest.param(
        "bad_turn_order", _c(("human", "a"), ("gpt", "b"), ("system", "c"), ("gpt", "d")), id="sys"
    ),
    pytest.param("no_assistant_ending", _c(("human", "a"), ("gpt", "b"), ("human", "c")), id="end"),
    pytest.param(
        "unanswered_call", _c(("human", "a"), ("function_call", CALL), ("gpt", "b")), id="unans"
    ),
    pytest.param(
        "unanswered_call",
        _c(("human", "a"), ("function_call", TWO_CALLS), ("observation", "one"), ("gpt", "b")),
        id="parallel-short",
    ),
    pytest.param("orphan_observation", _c(("observation", "r"), ("gpt", "b")), id="orphan-first"),
    pytest.param(
        "orphan_observation",
        _c(("human", "a"), ("gpt", "b"), ("observation", "r"), ("gpt", "c")),
        id="orphan-after-gpt",
    ),
    pytest.param(
        "orphan_observation",
        _c(
            ("human", "a"),
            ("function_call", CALL),
            ("observation", "1" + OBSERVATION_SEPARATOR + "2"),
            ("gpt", "c"),
        ),
        id="parallel-long",
    ),
    pytest.param("empty_turn", _c(("human", " "), ("gpt", "b")), id="empty-human"),
    pytest.param("empty_turn", _c(("human", "a"), ("gpt", "")), id="empty-gpt"),
    pytest.param(
        "empty_turn", _c(("human", "a"), ("gpt", "<think>\nx\n</think>\n\n")), id="thought-only"
    ),
    pytest.param(
        "bad_function_call", _c(("human", "a"), ("function_call", "call f()")), id="not-json"
    ),
    pytest.param(
        "bad_function_call", _c(("human", "a"), ("function_call", '{"name": "f"}')), id="no-args"
    ),
    pytest.param("bad_function_call", _c(("human", "a"), ("function_call", "[]")), id="no-calls"),
    pytest.param(
        "bad_function_call",
        _c(("human", "a"), ("function_call", "<think>\na\n</think>\n\nb\n</think>\n\n" + CALL)),
        id="tag-in-reasoning",
    ),
    pytest.param(
        "stray_think_tag",
        _c(("human", "a"), ("gpt", "<think>\na\n</think>\n\nb\n</think>\n\nc")),
        id="stray-tag",
    ),
]


@pytest.mark.parametrize(("code", "conversations"), STRUCTURE_CASES)
def test_check_structure_codes(code: str, conversations: list[dict[str, Any]]) -> None:
    assert code in REASONS
    codes = [i.code for i in check_structure(conversations)]
    assert code in codes


@pytest.mark.parametrize(
    "conversations",
    [
        _c(("human", "a"), ("gpt", "b")),
        _c(("system", "s"), ("human", "a"), ("gpt", "b")),
        _c(("human", "a"), ("function_call", CALL)),
        _c(
            ("human", "a"),
            ("function_call", TWO_CALLS),
            ("observation", "1" + OBSERVATION_SEPARATOR + "2"),
            ("gpt", "x"),
        ),
        _c(
            ("human", "a"),
            ("function_call", "<think>\nplan\n</think>\n\n" + CALL),
            ("observation", ""),
            ("gpt", "<think>\nw\n</think>\n\nb"),
        ),
    ],
)
def test_check_structure_accepts_what_llama_factory_accepts(
    conversations: list[dict[str, str]],
) -> None:
    assert check_structure(conversations) == []
    assert lf_accepts({"conversations": conversations})


def test_structure_issue_turn_is_the_conversation_index() -> None:
    issues = check_structure(_c(("human", "a"), ("gpt", "b"), ("human", "c"), ("human", "d")))
    assert [(i.code, i.turn) for i in issues] == [("bad_turn_order", 3), ("no_assistant_ending", 3)]


# --- property: every export of a sound trajectory is accepted ---------------------------------
_TEXT = st.text(alphabet='ab xyZ\n"{}[]:é😀', min_size=1, max_size=12).filter(str.strip)
_OBS = st.text(alphabet='ab x\n"{}:é', max_size=12)


@st.composite
def sound_trajectories(draw: st.DrawFn) -> Trajectory:
    """Semantically sound episodes in the untidy shapes seeds come in."""
    turns: list[Turn] = []
    exchanges = draw(st.integers(1, 3))
    for n in range(exchanges):
        turns.extend(user(draw(_TEXT)) for _ in range(draw(st.integers(1, 2))))
        steps = draw(st.integers(0, 3))
        for _ in range(steps):
            if draw(st.booleans()):
                turns.append(asst(draw(_TEXT)))  # a preamble turn before the call turn
            calls = [
                call(draw(st.text(alphabet="ABC123", min_size=6, max_size=6)))
                for _ in range(draw(st.integers(1, 3)))
            ]
            text = draw(st.one_of(st.just(""), _TEXT))
            turns.append(asst(text, *calls, reasoning=draw(st.one_of(st.none(), _TEXT))))
            turns.extend(tool(draw(_OBS)) for _ in calls)
        if draw(st.booleans()):
            turns.append(asst(""))  # an empty turn some seeds carry
        last = n == exchanges - 1
        if not (last and steps and draw(st.booleans())):
            for _ in range(draw(st.integers(1, 2))):
                turns.append(asst(draw(_TEXT), reasoning=draw(st.one_of(st.none(), _TEXT))))
    if draw(st.booleans()):
        turns.append(user("###STOP###"))
    return traj(*turns)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=sound_trajectories(), mode=st.sampled_from(["keep", "strip"]))
def test_every_export_of_a_sound_trajectory_is_accepted(t: Trajectory, mode: str) -> None:
    row = to_sharegpt(normalize(t), reasoning=mode)  # type: ignore[arg-type]
    assert lf_accepts(row)
    assert check_structure(row["conversations"]) == []
    assert validate(t, reasoning=mode) == []  # type: ignore[arg-type]
    made = [c for turn in t.turns for c in turn.tool_calls]
    exported = []
    for message in row["conversations"]:
        if message["from"] == "function_call":
            thought, calls = lf_parse_function_call(message["value"])
            assert (thought is not None) <= (mode == "keep")
            exported.extend(calls)
    assert exported == [(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in made]


# --- text-action rows ----------------------------------------------------------------------------
TEXT_EPISODE = Trajectory(
    turns=[
        Turn("user", "How many files?"),
        Turn(
            "assistant",
            "Think: list them.\n\nAct: bash\n\n```bash\nls | wc -l\n```",
            [ToolCall("bash", {"script": "ls | wc -l"})],
            reasoning="short plan",
        ),
        Turn("tool", "The output of the OS:\n\n3", name="bash"),
        Turn("assistant", "Think: three.\n\nAct: answer(3)", [ToolCall("answer", {"value": 3})]),
    ]
)


@pytest.mark.parametrize("mode", ["keep", "strip"])
def test_text_action_rows_keep_the_agents_text_and_have_no_tools(mode: str) -> None:
    rendered = render(TEXT_EPISODE, reasoning=mode, text_actions=True)
    think = "<think>\nshort plan\n</think>\n\n" if mode == "keep" else ""
    assert rendered.conversations == [
        {"from": "human", "value": "How many files?"},
        {"from": "gpt", "value": think + TEXT_EPISODE.turns[1].content},
        {"from": "human", "value": "The output of the OS:\n\n3"},
        {"from": "gpt", "value": TEXT_EPISODE.turns[3].content},
    ]
    assert not rendered.tools_column and rendered.repairs == ()
    assert rendered.where == rendered.origin == [0, 1, 2, 3]
    assert check_structure(rendered.conversations) == []
