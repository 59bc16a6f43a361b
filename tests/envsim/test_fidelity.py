from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.envs.airline import AirlineEnv
from factory.envs.airline.world import generate_world, write_world
from factory.envs.registry import available_domains
from factory.envsim.fidelity import (
    FidelityReport,
    load_trajectories,
    main,
    observations_match,
    replay_fidelity,
)
from factory.errors import SeedFormatError

# --- the bar: every recorded GPT-4o observation ------------------------------------------------


@pytest.fixture(scope="module")
def recorded(taubench_dir: Path) -> tuple[AirlineEnv, list[dict[str, Any]]]:
    return AirlineEnv.from_dir(taubench_dir), load_trajectories(
        taubench_dir / "gpt-4o-airline.json"
    )


def test_all_1164_recorded_observations_match(recorded: tuple[AirlineEnv, list]) -> None:
    base, records = recorded
    report = replay_fidelity(base.copy, records, renames={"province": "state"})
    assert report.mismatches == []
    assert (report.matched, report.total, report.trajectories) == (1164, 1164, 200)
    assert report.ok and report.unanswered == 0
    assert sum(total for _, total in report.per_tool.values()) == 1164
    assert len(report.per_tool) == 14


def test_the_rename_is_what_makes_user_details_match(recorded: tuple[AirlineEnv, list]) -> None:
    base, records = recorded
    report = replay_fidelity(base.copy, records)
    assert report.per_tool["get_user_details"] == [0, 120]
    assert report.total - report.matched == 120 and not report.ok


def test_cli_on_the_reference_data(
    taubench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mismatches.jsonl"
    code = main(
        [
            "--domain",
            "airline",
            "--db",
            str(taubench_dir),
            "--trajectories",
            str(taubench_dir / "gpt-4o-airline.json"),
            "--mismatches",
            str(out),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.startswith("1164/1164 observations match (200 trajectories)")
    assert out.read_text() == ""


# --- comparison rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "got", "renames", "match"),
    [
        ('{"a": 1, "b": [2]}', '{"b":[2],"a":1}', None, True),
        ('{"a": 1}', '{"a": 1.0}', None, False),
        ('{"province": "TX"}', '{"state": "TX"}', {"province": "state"}, True),
        ('{"province": "TX"}', '{"state": "TX"}', None, False),
        ("299.0", "299.0", None, True),
        ("299.0", "299", None, False),
        ("Transfer successful", "Transfer successful", None, True),
        ("", "", None, True),
        ("Error: x", "Error: y", None, False),
        ("[]", "Error: x", None, False),
        (None, "", None, False),
    ],
)
def test_observations_match(
    expected: Any, got: str, renames: dict[str, str] | None, match: bool
) -> None:
    assert observations_match(expected, got, renames) is match


# --- replay mechanics on a generated world -------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AirlineEnv]:
    folder = tmp_path_factory.mktemp("world")
    write_world(generate_world(5, n_users=3, n_flights=4, n_reservations=3), folder)
    return folder, AirlineEnv.from_dir(folder)


def _record(
    env: AirlineEnv, calls: list[tuple[str, dict]], *, corrupt: int | None = None, task_id: int = 7
) -> dict[str, Any]:
    """A tau-bench-style record whose observations come from ``env`` (one corrupted)."""
    world = env.copy()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "hi"},
    ]
    for i, (name, args) in enumerate(calls):
        observation = world.execute(name, args)
        if i == corrupt:
            observation = "Error: corrupted"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{i}", "name": name, "content": observation}
        )
    return {"task_id": task_id, "traj": messages}


def _calls(env: AirlineEnv) -> list[tuple[str, dict]]:
    uid = next(iter(env.state["users"]))
    rid = next(iter(env.state["reservations"]))
    return [
        ("get_user_details", {"user_id": uid}),
        ("cancel_reservation", {"reservation_id": rid}),
        ("get_reservation_details", {"reservation_id": rid}),
        ("send_certificate", {"user_id": uid, "amount": 10}),
    ]


def test_each_trajectory_starts_from_a_fresh_world(small: tuple[Path, AirlineEnv]) -> None:
    _, env = small
    record = _record(env, _calls(env))
    # replaying twice in one run only matches if the second starts from the pristine DB
    report = replay_fidelity(env.copy, [record, record])
    assert (report.matched, report.total) == (8, 8)


def test_mismatches_are_reported_with_their_call(small: tuple[Path, AirlineEnv]) -> None:
    _, env = small
    report = replay_fidelity(env.copy, [_record(env, _calls(env), corrupt=2, task_id=3)])
    assert (report.matched, report.total) == (3, 4)
    (mismatch,) = report.mismatches
    assert (mismatch.trajectory, mismatch.task_id, mismatch.step) == (0, 3, 2)
    assert mismatch.call["name"] == "get_reservation_details"
    assert mismatch.expected == "Error: corrupted"
    assert json.loads(mismatch.got or "")["status"] == "cancelled"


def test_calls_without_ids_orphans_and_unanswered_calls(small: tuple[Path, AirlineEnv]) -> None:
    _, env = small
    messages = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "think", "arguments": "{}"}}]},
        {"role": "tool", "content": "Error: ThinK.invoke() nonsense"},
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "think", "arguments": '{"thought": "x"}'}}],
        },
        {"role": "tool", "content": ""},
        {"role": "tool", "name": "think", "content": "orphan"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c9", "function": {"name": "calculate", "arguments": "{not json"}}
            ],
        },
    ]
    report = replay_fidelity(env.copy, [{"messages": messages}])
    assert (report.matched, report.total, report.unanswered) == (1, 3, 1)
    assert [m.got for m in report.mismatches] == [
        "Error: missing required argument 'thought' for think (think takes 'thought')",
        None,
    ]


def test_canonical_trajectories_are_accepted(small: tuple[Path, AirlineEnv]) -> None:
    _, env = small
    uid = next(iter(env.state["users"]))
    expected = env.copy().execute("get_user_details", {"user_id": uid})
    trajectory = Trajectory(
        turns=[
            Turn("user", "hi"),
            Turn("assistant", tool_calls=[ToolCall("get_user_details", {"user_id": uid}, "a")]),
            Turn("tool", expected, name="get_user_details", tool_call_id="a"),
        ],
        metadata={"task_id": "t1"},
    )
    report = replay_fidelity(env.copy, [trajectory])
    assert report.ok and report.summary() == "1/1 observations match (1 trajectories)"


def test_empty_replays_are_not_ok() -> None:
    assert not FidelityReport().ok


# --- CLI and loading ----------------------------------------------------------------------------


def test_cli_exit_codes_and_mismatch_file(
    small: tuple[Path, AirlineEnv], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, env = small
    jsonl = tmp_path / "trajs.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(r)
            for r in [_record(env, _calls(env)), _record(env, _calls(env), corrupt=0, task_id=9)]
        )
        + "\n"
    )
    out = tmp_path / "mm.jsonl"
    argv = ["--domain", "airline", "--db", str(folder), "--trajectories", str(jsonl)]
    assert main([*argv, "--mismatches", str(out)]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("7/8 observations match (2 trajectories)")
    assert "get_user_details: 1/2" in printed
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["task_id"] == 9 and row["step"] == 0 and row["expected"] == "Error: corrupted"
    assert set(row) == {"trajectory", "task_id", "step", "call", "expected", "got"}


KNOWN = ", ".join(available_domains())


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--domain", "hotel"], 2, f"unknown domain 'hotel'; known domains: {KNOWN} ("),
        (["--domain", "airline", "--rename", "nope"], 2, "OLD=NEW"),
        (["--domain", "airline", "--db", "/nonexistent"], 2, "cannot read"),
    ],
)
def test_cli_errors_are_one_line(
    small: tuple[Path, AirlineEnv],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    message: str,
) -> None:
    folder, _ = small
    trajectories = tmp_path / "t.json"
    trajectories.write_text("[]")
    base = {"--db": str(folder), "--trajectories": str(trajectories)}
    for flag in ("--db", "--trajectories"):
        if flag not in argv:
            argv = [*argv, flag, base[flag]]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [("[{]", "invalid_json"), ('{"a": 1}\n{oops\n', "invalid_json"), ("[1, 2]", "not_an_object")],
)
def test_load_trajectories_errors(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SeedFormatError) as info:
        load_trajectories(path)
    assert info.value.reason == reason


def test_load_trajectories_reads_lists_and_jsonl(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('[{"traj": []}]')
    (tmp_path / "b.jsonl").write_text('{"traj": []}\n\n{"traj": []}\n')
    assert len(load_trajectories(tmp_path / "a.json")) == 1
    assert len(load_trajectories(tmp_path / "b.jsonl")) == 2
    with pytest.raises(SeedFormatError):
        load_trajectories(tmp_path / "missing.json")
