from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.core.formats.textaction import parse as parse_text
from factory.core.grammar import ActionGrammar
from factory.core.labels import (
    GROUPS,
    action_labels,
    arg_cardinality,
    call_observations,
    declines,
    group_for,
    step_labels,
    trajectory_labels,
)
from factory.core.trajectory import ToolCall, Trajectory, Turn
from tests.conftest import ROOT

WRITE = {"cancel_reservation", "book_reservation", "send_certificate"}


def assistant(content: str = "", *calls: tuple[str, dict[str, Any]]) -> Turn:
    return Turn(
        "assistant",
        content,
        tool_calls=[ToolCall(name, args, id=f"call_{name}") for name, args in calls],
    )


def tool(name: str, content: str, call_id: str | None = None) -> Turn:
    return Turn("tool", content, name=name, tool_call_id=call_id)


def user(content: str) -> Turn:
    return Turn("user", content)


def traj(*turns: Turn, **meta: Any) -> Trajectory:
    return Trajectory(system="policy", turns=list(turns), metadata=dict(meta))


GET = ("get_reservation_details", {"reservation_id": "ABC123"})
CANCEL = ("cancel_reservation", {"reservation_id": "ABC123", "reason": "change of plan"})
TRANSFER = ("transfer_to_human_agents", {"summary": "wants a refund"})


# --- groups -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "delta", "group"),
    [
        ("no_change", 0, "No-Change"),
        ("change", 1, "Simple"),
        ("change", 2, "Simple"),
        ("change", 3, "Medium"),
        ("change", 6, "Medium"),
        ("change", 7, "Difficult"),
        ("change", 12, "Difficult"),
        ("change", 13, "Beyond"),
        ("change", 10_000, "Beyond"),
        ("failure", 0, "Failure"),
        ("failure", None, "Failure"),
        ("error", 5, "Failure"),
        ("error", None, "Failure"),
        ("completed", 0, "No-Change"),
        ("refused", 0, "No-Change"),
        ("transferred", 2, "Simple"),
        ("completed", 9, "Difficult"),
    ],
)
def test_group_boundaries(outcome: str, delta: int | None, group: str) -> None:
    assert group_for(outcome, delta) == group
    assert group in GROUPS


@pytest.mark.parametrize(
    ("outcome", "delta", "match"),
    [
        ("done", 1, "unknown outcome"),
        ("change", None, "exact"),
        ("completed", None, "exact"),
        ("change", -1, "non-negative"),
        ("change", True, "non-negative"),
        ("change", 1.5, "non-negative"),
    ],
)
def test_group_for_refuses_what_it_cannot_place(outcome: str, delta: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_for(outcome, delta)


# --- step labels --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observation", "n_ops", "outcome", "group"),
    [
        ("Error: reservation not found", 0, "failure", "Failure"),
        ("Error", 0, "failure", "Failure"),
        ('{"reservation_id": "ABC123"}', 0, "no_change", "No-Change"),
        ('{"status": "cancelled"}', 1, "change", "Simple"),
        ('{"status": "cancelled"}', 4, "change", "Medium"),
        ("ok", 13, "change", "Beyond"),
    ],
)
def test_step_labels(observation: str, n_ops: int, outcome: str, group: str) -> None:
    ops = [{"op": "replace", "path": f"/x/{i}", "before": 0, "after": 1} for i in range(n_ops)]
    labels = step_labels(
        observation, ops, {"a": 1, "b": [1, 2]}, task_id=3, user_id="u_1", env_id="env-7"
    )
    assert labels == {
        "kind": "step",
        "outcome": outcome,
        "group": group,
        "delta_size": n_ops,
        "arg_cardinality": 2,
        "task_id": 3,
        "user_id": "u_1",
        "env_id": "env-7",
    }
    assert json.loads(json.dumps(labels)) == labels


def test_step_labels_default_ids_are_none() -> None:
    labels = step_labels("{}", [], {})
    assert (labels["task_id"], labels["user_id"], labels["env_id"]) == (None, None, None)
    assert labels["arg_cardinality"] == 0


@pytest.mark.parametrize(
    ("arguments", "n"),
    [
        ({}, 0),
        ({"a": {"b": 1, "c": 2}}, 1),
        ({"a": 1, "b": 2, "c": 3}, 3),
        ("not a dict", 0),
        (None, 0),
        ([1, 2], 0),
    ],
)
def test_arg_cardinality_counts_top_level_keys(arguments: Any, n: int) -> None:
    assert arg_cardinality(arguments) == n


# --- trajectory labels ----------------------------------------------------------------------


def test_completed_after_a_successful_write() -> None:
    t = traj(
        user("Cancel ABC123 please."),
        assistant("", GET),
        tool("get_reservation_details", '{"reservation_id": "ABC123"}'),
        assistant("", CANCEL),
        tool("cancel_reservation", '{"status": "cancelled"}'),
        # Decline words do not make it a refusal once a write went through.
        assistant("Done. Unfortunately the refund takes 5-7 days."),
        task_id=4,
        user_id="mia_li_3668",
    )
    labels = trajectory_labels(t, write_tools=WRITE)
    assert labels == {
        "kind": "trajectory",
        "outcome": "completed",
        "group": None,
        "arg_cardinality": 2,
        "calls": 2,
        "task_id": 4,
        "user_id": "mia_li_3668",
        "env_id": None,
        "write_calls": 1,
    }


def test_exact_delta_replaces_write_calls_and_gives_a_group() -> None:
    t = traj(
        user("Cancel."),
        assistant("", CANCEL),
        tool("cancel_reservation", "{}"),
        assistant("Cancelled."),
        env_id="w1",
    )
    labels = trajectory_labels(t, write_tools=WRITE, delta_size=3)
    assert labels["delta_size"] == 3
    assert "write_calls" not in labels
    assert labels["group"] == "Medium"
    assert labels["env_id"] == "w1"


def test_refused_when_the_closing_texts_decline() -> None:
    t = traj(
        user("Cancel ABC123, I changed my mind."),
        assistant("", GET),
        tool("get_reservation_details", '{"cabin": "basic_economy"}'),
        assistant("Unfortunately, basic economy without insurance cannot be cancelled."),
        user("Ok, thanks."),
        assistant("You're welcome! Have a great day."),
    )
    labels = trajectory_labels(t, write_tools=WRITE)
    assert labels["outcome"] == "refused"
    assert labels["write_calls"] == 0
    assert trajectory_labels(t, write_tools=WRITE, delta_size=0)["group"] == "No-Change"


def test_refused_without_any_tool_call() -> None:
    t = traj(user("Add insurance to my trip."), assistant("I\u2019m unable to add insurance now."))
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "refused"


def test_decline_before_the_last_observation_does_not_count() -> None:
    t = traj(
        user("Cancel it."),
        assistant("I can't do that without the reservation id."),
        user("It is ABC123."),
        assistant("", GET),
        tool("get_reservation_details", '{"cabin": "business"}'),
        assistant("Your trip is in business class, flying on May 20."),
    )
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "completed"


def test_failed_write_then_decline_is_refused() -> None:
    t = traj(
        user("Cancel ABC123."),
        assistant("", CANCEL),
        tool("cancel_reservation", "Error: non-refundable"),
        assistant("I'm sorry, but this reservation is not eligible for cancellation."),
    )
    labels = trajectory_labels(t, write_tools=WRITE)
    assert labels["outcome"] == "refused"
    assert labels["write_calls"] == 0


def test_transferred() -> None:
    t = traj(
        user("I want a human."),
        assistant("", TRANSFER),
        tool("transfer_to_human_agents", "Transfer successful"),
        assistant("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."),
    )
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "transferred"


def test_transfer_wins_over_a_decline_and_a_later_error() -> None:
    t = traj(
        user("Refund me."),
        assistant("Unfortunately I cannot refund this.", TRANSFER),
        tool("transfer_to_human_agents", "Transfer successful"),
        assistant("", GET),
        tool("get_reservation_details", "Error: reservation not found"),
    )
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "transferred"


def test_a_failed_transfer_is_not_a_transfer() -> None:
    t = traj(
        user("Human please."),
        assistant("", TRANSFER),
        tool("transfer_to_human_agents", "Error: missing summary"),
        assistant("Let me help you myself. What do you need?"),
    )
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "completed"


def test_transfer_tool_name_is_a_parameter() -> None:
    t = traj(
        user("Escalate."),
        assistant("", ("escalate", {})),
        tool("escalate", "ok"),
        assistant("Escalated."),
    )
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "completed"
    labels = trajectory_labels(t, write_tools=WRITE, transfer_tool="escalate")
    assert labels["outcome"] == "transferred"


@pytest.mark.parametrize("closing", [[], [assistant("   ")], [user("hello?")]])
def test_error_when_the_episode_ends_on_an_error(closing: list[Turn]) -> None:
    t = traj(
        user("Book it."),
        assistant("", ("book_reservation", {"user_id": "u", "flights": []})),
        tool("book_reservation", "Error: payment amount does not add up"),
        *closing,
    )
    labels = trajectory_labels(t, write_tools=WRITE)
    assert labels["outcome"] == "error"
    assert labels["group"] == "Failure"
    assert trajectory_labels(t, write_tools=WRITE, delta_size=0)["group"] == "Failure"


def test_an_answer_after_the_error_is_a_recovery() -> None:
    t = traj(
        user("Book it."),
        assistant("", ("book_reservation", {"user_id": "u"})),
        tool("book_reservation", "Error: payment amount does not add up"),
        assistant("The amounts did not add up; shall I charge the rest to your card?"),
    )
    assert trajectory_labels(t, write_tools=WRITE)["outcome"] == "completed"


def test_write_calls_count_only_successful_writes() -> None:
    t = traj(
        user("Two certificates please."),
        assistant("", ("send_certificate", {"user_id": "u", "amount": 50})),
        tool("send_certificate", "Certificate sent"),
        assistant("", ("send_certificate", {"user_id": "u", "amount": 5000})),
        tool("send_certificate", "Error: amount too large"),
        assistant("", ("calculate", {"expression": "1+1"})),
        tool("calculate", "2"),
        assistant("", ("send_certificate", {"user_id": "u", "amount": 10})),  # never answered
    )
    labels = trajectory_labels(t, write_tools=WRITE)
    assert labels["write_calls"] == 1
    assert labels["calls"] == 4
    assert labels["arg_cardinality"] == 2


def test_call_observations_pair_by_id_then_order() -> None:
    t = traj(
        user("hi"),
        assistant("", ("a", {}), ("b", {})),
        tool("b", "answer b", call_id="call_b"),
        tool("a", "answer a", call_id="call_a"),
        assistant("", ("c", {}), ("d", {})),
        tool("c", "answer c"),
        user("anything else?"),
        tool("d", "orphan: answers nothing once a user spoke"),
    )
    pairs = [(c.name, obs) for c, obs in call_observations(t)]
    assert pairs == [("a", "answer a"), ("b", "answer b"), ("c", "answer c"), ("d", None)]


@pytest.mark.parametrize(
    ("text", "declined"),
    [
        ("Unfortunately, that is not possible.", True),
        ("I'm sorry, but I can't change a basic economy flight.", True),
        ("I am unable to process the cancellation.", True),
        ("We are not able to refund this.", True),
        ("I cannot add insurance after booking.", True),
        ("I won\u2019t be able to do that.", True),
        ("This ticket is not eligible for a refund.", True),
        ("That would be against our policy.", True),
        ("Your reservation is cancelled.", False),
        ("If you are unable to find it, check your email.", False),
        ("I'm sorry to hear that! Let me look it up.", False),
        ("You can take 4 free checked bags.", False),
    ],
)
def test_decline_heuristic(text: str, declined: bool) -> None:
    assert declines(text) is declined


# --- against the recorded tau-bench trajectories ---------------------------------------------


@pytest.mark.shared
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_recorded_airline_calls_label_consistently(taubench_dir: Path) -> None:
    """Replay each recorded trajectory: step labels follow the executor, trajectory
    labels agree with them (transfers counted from the calls themselves)."""
    from factory.core.delta import diff
    from factory.core.formats import parse_record
    from factory.envs.airline import AirlineEnv

    records = json.loads((taubench_dir / "gpt-4o-airline.json").read_text(encoding="utf-8"))
    tools = json.loads((taubench_dir / "tools.json").read_text(encoding="utf-8"))
    assert "book_reservation" in {t["function"]["name"] for t in tools}
    write = {
        "book_reservation",
        "cancel_reservation",
        "send_certificate",
        "update_reservation_baggages",
        "update_reservation_flights",
        "update_reservation_passengers",
    }
    pristine = AirlineEnv.from_dir(taubench_dir)
    outcomes: dict[str, int] = {}
    groups: dict[str, int] = {}
    for record in records:
        t = parse_record(record, source="gpt-4o-airline.json")
        env = pristine.copy()
        start = env.copy().state
        pairs = call_observations(t)
        steps = []
        for call, recorded in pairs:
            before = env.copy()
            observation = env.execute(call.name, call.arguments)
            step = step_labels(
                observation,
                diff(before.state, env.state),
                call.arguments,
                task_id=t.metadata.get("task_id"),
                user_id=t.metadata.get("user_id"),
            )
            steps.append(step)
            groups[step["group"]] = groups.get(step["group"], 0) + 1
            assert (step["outcome"] == "failure") == (recorded or "").startswith("Error")
            if call.name not in write:
                assert step["delta_size"] == 0 or step["outcome"] == "failure"
        labels = trajectory_labels(t, write_tools=write)
        exact = trajectory_labels(t, write_tools=write, delta_size=len(diff(start, env.state)))
        assert labels["outcome"] == exact["outcome"]
        # write_calls counts successful write calls; a repeated identical write changes nothing.
        writes_ok = sum(
            1
            for (c, _), st in zip(pairs, steps, strict=True)
            if c.name in write and st["outcome"] != "failure"
        )
        changed = sum(1 for st in steps if st["outcome"] == "change")
        assert labels["write_calls"] == writes_ok >= changed
        if changed == 0:
            assert exact["delta_size"] == 0
        called_transfer = any(c.name == "transfer_to_human_agents" for _, c in t.calls())
        assert (labels["outcome"] == "transferred") == called_transfer
        outcomes[labels["outcome"]] = outcomes.get(labels["outcome"], 0) + 1
    assert sum(outcomes.values()) == len(records) == 200
    assert set(outcomes) <= {"completed", "refused", "transferred", "error"}
    assert outcomes["transferred"] == 48
    assert {"Failure", "No-Change", "Simple"} <= set(groups)


# --- text-action episodes --------------------------------------------------------------------
def _episode(grammar_name: str, *values: str) -> tuple[Trajectory, ActionGrammar]:
    grammar = ActionGrammar.load(ROOT / "prompts" / grammar_name / "grammar.yaml")
    roles = ("human", "gpt")
    record = {"conversations": [{"from": roles[i % 2], "value": v} for i, v in enumerate(values)]}
    return parse_text(record, grammar=grammar), grammar


BASH = "Think: look.\n\nAct: bash\n\n```bash\nls /srv/data\n```"


@pytest.mark.parametrize(
    ("observation", "answer", "outcome", "errors"),
    [
        ("a.csv\nb.csv", "2", "completed", 0),
        ("ls: cannot access '/srv/data': No such file or directory", "0", "error", 1),
        (
            "ls: cannot access '/srv/data': No such file or directory",
            '"not found: /srv/data does not exist"',
            "gave_up",
            1,
        ),
    ],
)
def test_action_labels_outcomes(observation: str, answer: str, outcome: str, errors: int) -> None:
    traj, grammar = _episode(
        "os", "How many files in /srv/data?", BASH, observation, f"Act: answer({answer})"
    )
    labels = action_labels(traj, grammar)
    assert labels["outcome"] == outcome and labels["error_observations"] == errors
    assert labels["group"] == ("Failure" if outcome == "error" else None)
    assert labels["calls"] == 2 and labels["arg_cardinality"] == 1
    assert labels["apps"] == 1 and labels["app_names"] == ["shell"]  # answer is no app


def test_action_labels_count_apps_and_the_widest_call() -> None:
    sheet = "/home/office/Spreadsheets/c.xlsx"
    traj, grammar = _episode(
        "office",
        "Log the taxi from m-7.",
        'Act: email.read(message_id="m-7")',
        "Taxi 38.50 on 2024-05-03",
        f'Act: sheets.append_row(path="{sheet}", values=["2024-05-03", 38.5])',
        "Appended row 2",
        "Act: finish",
    )
    labels = action_labels(traj, grammar)
    assert labels["apps"] == 2 and labels["app_names"] == ["email", "sheets"]
    assert labels["arg_cardinality"] == 2 and labels["outcome"] == "completed"
