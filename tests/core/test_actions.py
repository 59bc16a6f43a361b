"""Action-level validation of text-action trajectories: one reason code per rule."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from factory.core.actions import ACTION_CODES, check_actions
from factory.core.formats import parse_record
from factory.core.formats.textaction import parse
from factory.core.grammar import ActionGrammar
from factory.core.trajectory import ToolCall, Trajectory
from factory.core.validate import validate
from tests.conftest import ROOT

OS = ActionGrammar.load(ROOT / "prompts" / "os" / "grammar.yaml")
BASH = "Think: look.\n\nAct: bash\n\n```bash\nls /srv\n```"
ANSWER = "Think: two.\n\nAct: answer(2)"


def episode(*values: str, grammar: ActionGrammar = OS) -> Trajectory:
    roles = ["human", "gpt"]
    record = {"conversations": [{"from": roles[i % 2], "value": v} for i, v in enumerate(values)]}
    return parse(record, grammar=grammar)


def explicit(*pairs: tuple[str, str]) -> Trajectory:
    return parse({"messages": [{"role": r, "content": c} for r, c in pairs]}, grammar=OS)


CASES = {
    "no_action": episode("Count.", "Think: I do not know."),
    "unknown_action": episode("Count.", "Act: python\n\n```python\nprint(1)\n```", "1", ANSWER),
    "malformed_action": episode("Count.", "Act: answer(2", ),
    "multiple_actions": episode("Count.", BASH + "\nAct: answer(2)", "a", ANSWER),
    "answer_not_last": episode("Count.", ANSWER, "are you sure?", ANSWER),
    "action_without_observation": explicit(("user", "Count."), ("assistant", BASH),
                                           ("assistant", ANSWER)),
    "observation_without_action": explicit(("user", "Count."), ("assistant", BASH),
                                           ("tool", "a"), ("tool", "b"), ("assistant", ANSWER)),
}  # fmt: skip


def test_every_action_code_has_a_case() -> None:
    assert set(CASES) == set(ACTION_CODES)


@pytest.mark.parametrize("code", ACTION_CODES)
def test_every_action_code_is_reachable(code: str) -> None:
    issues = check_actions(CASES[code], OS)
    assert issues and issues[0].code == code, issues
    assert validate(CASES[code], grammar=OS)[0].code == code


def test_a_well_formed_episode_has_no_issue() -> None:
    assert check_actions(episode("Count.", BASH, "a\nb", ANSWER), OS) == []


def test_an_action_at_the_end_misses_its_observation() -> None:
    issues = check_actions(episode("Count.", BASH), OS)
    assert [(i.code, i.turn) for i in issues] == [("action_without_observation", 1)]


def test_preamble_replies_are_allowed_only_before_the_first_action() -> None:
    lenient = dataclasses.replace(OS, preamble_replies=True)
    ok = episode("Instructions...", "OK.", "Count.", BASH, "a", ANSWER, grammar=lenient)
    assert [t.role for t in ok.turns][:3] == ["user", "assistant", "user"]
    assert check_actions(ok, lenient) == []
    late = episode("Count.", BASH, "a", "OK.", "b", ANSWER, grammar=lenient)
    assert check_actions(late, lenient)[0].code == "no_action"


def test_a_call_that_is_not_its_text_is_a_field_error() -> None:
    traj = episode("Count.", BASH, "a", ANSWER)
    traj.turns[1].tool_calls = [ToolCall("bash", {"script": "rm -rf /"})]
    assert [i.code for i in check_actions(traj, OS)] == ["bad_field_type"]


TEXT_SEEDS = [
    p
    for p in sorted((ROOT / "seeds").glob("*/*.jsonl"))
    if (ROOT / "prompts" / p.parent.name / "grammar.yaml").is_file()
]


@pytest.mark.parametrize("path", TEXT_SEEDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_text_action_seeds_are_valid(path: Path) -> None:
    grammar = ActionGrammar.load(ROOT / "prompts" / path.parent.name / "grammar.yaml")
    lines = path.read_text().splitlines()
    assert len(lines) >= 8
    for n, line in enumerate(lines):
        traj = parse_record(json.loads(line), source=f"{path.name}:{n}", grammar=grammar)
        assert validate(traj, grammar=grammar) == [], (path.name, n)
        assert traj.metadata["repairs"] == [], (path.name, n)
