"""Action grammars: loading with key paths, parsing one agent turn, lossless repairs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from factory.core.grammar import ActionGrammar
from factory.core.trajectory import ToolCall
from factory.errors import ConfigError
from tests.conftest import ROOT

GRAMMARS = sorted((ROOT / "prompts").glob("*/grammar.yaml"))
OS = ActionGrammar.load(ROOT / "prompts" / "os" / "grammar.yaml")
WEB = ActionGrammar.load(ROOT / "prompts" / "webshop" / "grammar.yaml")
OFFICE = ActionGrammar.load(ROOT / "prompts" / "office" / "grammar.yaml")

BASE: dict[str, Any] = {
    "name": "t",
    "prefix": "Act:",
    "actions": [
        {"name": "bash", "form": "fence", "language": "bash", "arguments": [{"name": "script"}]},
        {"name": "search", "form": "bracket", "arguments": [{"name": "query"}]},
        {"name": "answer", "form": "call", "arguments": [{"name": "value"}], "final": True},
    ],
}


@pytest.mark.parametrize("path", GRAMMARS, ids=lambda p: p.parent.name)
def test_shipped_grammars_load_and_their_examples_parse(path: Path) -> None:
    grammar = ActionGrammar.load(path)
    assert grammar.describe().count("\n- ") == len(grammar.actions) - 1 or grammar.actions
    for action in grammar.actions:
        if action.example:
            parsed = grammar.parse_turn(action.example)
            assert parsed.call is not None and parsed.call.name == action.name, parsed.issues
            assert parsed.repairs == [], (action.name, parsed.repairs)


@pytest.mark.parametrize(
    ("mutate", "key_path"),
    [
        (lambda g: g.update(bogus=1), "bogus"),
        (lambda g: g.update(separator="\t"), "separator"),
        (lambda g: g["actions"][0].update(form="blob"), "actions[0].form"),
        (lambda g: g["actions"][0].pop("language"), "actions[0].language"),
        (lambda g: g["actions"][1].update(language="py"), "actions[1].language"),
        (lambda g: g["actions"][1].update(name="1search"), "actions[1].name"),
        (lambda g: g["actions"].append(dict(g["actions"][1])), "actions[3].name"),
        (
            lambda g: g["actions"][1].update(final_when={"query": "("}),
            "actions[1].final_when.query",
        ),
        (lambda g: g["actions"][1].update(final_when={"nope": "x"}), "actions[1].final_when.nope"),
        (
            lambda g: g["actions"][1].update(arguments=[{"name": "q", "schema": {"type": 3}}]),
            "actions[1].arguments[0].schema",
        ),
        (lambda g: g["actions"][1]["arguments"].append({"name": "q2"}), "actions[1].arguments"),
        (lambda g: g.update(give_up=[{"action": "fly"}]), "give_up[0].action"),
        (lambda g: g.update(observations={"error": ["[unclosed"]}), "observations.error[0]"),
        (lambda g: g.update(actions=[]), "actions"),
        (lambda g: g.update(directions=[""]), "directions"),
    ],
)
def test_a_malformed_grammar_names_its_key_path(mutate: Any, key_path: str) -> None:
    raw = copy.deepcopy(BASE)
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        ActionGrammar.from_dict(raw)
    assert err.value.key_path == key_path


def test_a_grammar_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "grammar.yaml"
    path.write_text("name: x\nactions: [{name: a, form: blob}]\n")
    with pytest.raises(ConfigError, match=r"grammar\.yaml: actions\[0\]\.form"):
        ActionGrammar.load(path)


def test_two_fence_actions_need_a_prefix() -> None:
    raw = copy.deepcopy(BASE)
    del raw["prefix"]
    raw["actions"].append({"name": "py", "form": "fence", "language": "python"})
    with pytest.raises(ConfigError, match="at most one"):
        ActionGrammar.from_dict(raw)


@pytest.mark.parametrize(
    ("text", "name", "arguments", "final"),
    [
        (
            "Think: x\n\nAct: bash\n\n```bash\nls -l /etc\n```",
            "bash",
            {"script": "ls -l /etc"},
            False,
        ),
        ("Think: x\n\nAct: answer(42)", "answer", {"value": 42}, True),
        ("Think: x\n\nAct: answer(/home/user)", "answer", {"value": "/home/user"}, True),
        ('Think: x\n\nAct: answer("a, b")', "answer", {"value": "a, b"}, True),
        ("Think: x\n\nAct: finish", "finish", {}, True),
    ],
)
def test_os_actions_parse(text: str, name: str, arguments: dict[str, Any], final: bool) -> None:
    parsed = OS.parse_turn(text)
    assert parsed.call == ToolCall(name, arguments) and parsed.final is final
    assert parsed.text == text and not parsed.repairs and not parsed.issues


def test_bracket_actions_and_final_when() -> None:
    search = WEB.parse_turn("Thought:\nfind it\n\nAction:\nsearch[red shoes [size 8]]")
    assert search.call == ToolCall("search", {"query": "red shoes [size 8]"}) and not search.final
    buy = WEB.parse_turn("Thought:\nok\n\nAction:\nclick[Buy Now]")
    assert buy.call == ToolCall("click", {"target": "Buy Now"}) and buy.final
    assert not WEB.parse_turn("Thought:\nok\n\nAction:\nclick[Buy Now later]").final


def test_call_actions_take_keywords_and_lists() -> None:
    text = 'Act: sheets.append_row(path="/home/office/Spreadsheets/a.xlsx", values=["x", 2.5])'
    parsed = OFFICE.parse_turn(text)
    assert parsed.call == ToolCall(
        "sheets.append_row", {"path": "/home/office/Spreadsheets/a.xlsx", "values": ["x", 2.5]}
    )
    assert OFFICE.app_of("sheets.append_row") == "sheets" and OFFICE.app_of("answer") is None


@pytest.mark.parametrize(
    ("text", "repaired", "notes"),
    [
        (
            "Think: x\nAct:bash\n```\nls\n```  \n",
            "Think: x\nAct: bash\n\n```bash\nls\n```",
            ["fence_language", "action_whitespace"],
        ),
        ("Act: bash\n\n```sh\nls\n```", "Act: bash\n\n```bash\nls\n```", ["fence_language"]),
        ("Act: bash\n\n```bash\nls -l", "Act: bash\n\n```bash\nls -l\n```", ["close_fence"]),
        ("Act: `answer(3)`", "Act: answer(3)", ["unwrap_action"]),
        ("Act:\n```\nanswer(3)\n```", "Act: answer(3)", ["unwrap_action"]),
        ("  Act:  finish   \n\n", "  Act: finish", ["action_whitespace"]),
        ("Act: answer (3)", "Act: answer(3)", ["action_whitespace"]),
    ],
)
def test_lossless_repairs_are_noted(text: str, repaired: str, notes: list[str]) -> None:
    parsed = OS.parse_turn(text)
    assert parsed.issues == [] and parsed.call is not None
    assert parsed.text == repaired and parsed.repairs == notes
    again = OS.parse_turn(parsed.text)
    assert again.call == parsed.call and again.repairs == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Think: I am not sure what to do.", "no_action"),
        ("I will Act: finish", "no_action"),
        ("Act: python\n\n```python\nprint(1)\n```", "unknown_action"),
        ("Act: 42", "unknown_action"),
        ("Act: bash\n\n```bash\nls\n```\nAct: finish", "multiple_actions"),
        ("Act: bash ls", "malformed_action"),
        ("Act: bash\n\n```python\nls\n```", "malformed_action"),
        ("Act: bash\n\n```bash\n\n```", "malformed_action"),
        ("Act: answer(3", "malformed_action"),
        ("Act: answer(3) thanks", "malformed_action"),
        ('Act: answer("a", 2)', "malformed_action"),
        ("Act: answer(value=1, other=2)", "malformed_action"),
        ("Act: answer()", "malformed_action"),
        ("Act: finish(3)", "malformed_action"),
    ],
)
def test_broken_turns_get_their_reason(text: str, code: str) -> None:
    parsed = OS.parse_turn(text)
    assert parsed.call is None and parsed.text == text
    assert [c for c, _ in parsed.issues] == [code]
    assert parsed.found is (code != "no_action")


def test_argument_schemas_are_checked() -> None:
    bad = OFFICE.parse_turn('Act: email.read(message_id="2041")')
    assert bad.call is None and bad.issues[0][0] == "malformed_action"
    assert "message_id" in bad.issues[0][1]


def test_without_a_prefix_actions_start_a_line() -> None:
    raw = copy.deepcopy(BASE)
    del raw["prefix"]
    grammar = ActionGrammar.from_dict(raw)
    assert grammar.parse_turn("I'll look.\nsearch[kettle]").call == ToolCall(
        "search", {"query": "kettle"}
    )
    assert grammar.parse_turn("I could search[kettle] later").issues[0][0] == "no_action"
    assert grammar.parse_turn("Let me run it.\n```bash\nls\n```").call == ToolCall(
        "bash", {"script": "ls"}
    )
    assert grammar.parse_turn("Then:\nscroll[down]").issues[0][0] == "unknown_action"


@pytest.mark.parametrize("grammar", [OS, WEB, OFFICE], ids=lambda g: g.name)
def test_rendered_actions_parse_back(grammar: ActionGrammar) -> None:
    for action in grammar.actions:
        args = {a.name: "x" for a in action.arguments}
        if action.name == "email.read":
            args = {"message_id": "m-1"}
        elif action.name == "email.send":
            args.update(to="a@b.example")
        elif action.name in ("calendar.list_events", "calendar.add_event"):
            args.update(date="2024-05-14", start="09:00", end="10:00", attendees=["a@b"])
        elif action.name == "calendar.delete_event":
            args = {"event_id": "ev-1"}
        elif action.name == "sheets.append_row":
            args["values"] = ["x", 1]
        elif action.name == "sheets.write_cell":
            args["cell"] = "A1"
        declared = {a.name for a in action.arguments}
        call = ToolCall(action.name, {k: v for k, v in args.items() if k in declared})
        text = "Think: go.\n\n" + grammar.render_action(call)
        assert grammar.parse_turn(text).call == call, (text, grammar.parse_turn(text).issues)


def test_outcome_patterns() -> None:
    assert OS.is_error("bash: ss: command not found") and not OS.is_error("16")
    assert OS.gives_up(ToolCall("answer", {"value": "not found: no such file"}))
    assert not OS.gives_up(ToolCall("answer", {"value": 42}))
    assert WEB.gives_up(ToolCall("stop", {"reason": "nothing under 20 dollars"}))
