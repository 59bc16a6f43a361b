"""EnvSimBench compatibility (issue 10, point 8): its lenient Config Match, records, SFT layout.

The records and rows here are built by hand in EnvSimBench's schema (``task_info``,
``step_detail`` with ``action``, ``observation``, ``config_before``, ``config_after``,
``config_change.changes[]``; ``env_code``), from real airline steps.
"""

from __future__ import annotations

import json
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

from factory.envsim.envsimbench import (
    config_match,
    diff_dicts,
    from_record,
    from_sft_row,
    to_sft_row,
    tool_call_text,
)
from factory.envsim.sampler import EpisodeSampler
from factory.envsim.simulator import check_sample
from factory.envsim.simulator import config_match as strict_config_match
from factory.evaluate import evaluate, main

BEFORE = {
    "users": {
        "u1": {"name": "Ada", "balance": 10, "cards": {"c1": {"amount": 5}, "c2": {"amount": 7}}}
    }
}


def _after(change: Any) -> dict[str, Any]:
    state = deepcopy(BEFORE)
    change(state)
    return state


def _delete_card(state: dict[str, Any]) -> None:
    del state["users"]["u1"]["cards"]["c1"]


def _pay(state: dict[str, Any]) -> None:
    state["users"]["u1"]["balance"] = 20
    state["users"]["u1"]["name"] = "Ada L"


# --- (a) the metric, case by case ---------------------------------------------------------------


def test_a_predicted_null_instead_of_a_deletion_passes() -> None:
    after = _after(_delete_card)
    pred = [
        {"path": "users.u1.cards.c1", "type": "modified", "before": {"amount": 5}, "after": None}
    ]
    assert config_match(pred, BEFORE, after)
    assert not strict_config_match(
        [{"op": "replace", "path": "/users/u1/cards/c1", "before": {"amount": 5}, "after": None}],
        BEFORE,
        after,
    )


def test_a_correct_deletion_fails() -> None:
    after = _after(_delete_card)
    assert not config_match([{"path": "users.u1.cards.c1", "type": "removed"}], BEFORE, after)
    assert not config_match([{"path": "users.u1.cards.c1", "type": "delete"}], BEFORE, after)
    pointer = [{"op": "remove", "path": "/users/u1/cards/c1", "before": {"amount": 5}}]
    assert strict_config_match(pointer, BEFORE, after)  # right for the factory's metric
    assert not config_match(pointer, BEFORE, after)  # translated, it fails the same way


def test_overwriting_a_parent_path_passes() -> None:
    after = _after(_pay)
    parent = deepcopy(after["users"]["u1"])
    parent["invented"] = True  # not in the true state: the parent write still passes
    pred = [{"path": "users.u1", "type": "modified", "value": parent}]
    assert config_match(pred, BEFORE, after)
    assert not strict_config_match(
        [{"op": "replace", "path": "/users/u1", "before": BEFORE["users"]["u1"], "after": parent}],
        BEFORE,
        after,
    )


def test_extra_wrong_changes_pass() -> None:
    after = _after(_pay)
    right = [
        {"path": "users.u1.balance", "type": "modified", "after": 20},
        {"path": "users.u1.name", "type": "modified", "after": "Ada L"},
    ]
    wrong = [
        {"path": "users.u1.cards.c2.amount", "type": "modified", "after": 0},
        {"path": "users.u9.name", "type": "added", "value": "Nobody"},  # parents are created
    ]
    assert config_match(right + wrong, BEFORE, after)
    assert not config_match(right[:1] + wrong, BEFORE, after)  # a missed true change fails


def test_values_compare_with_pythons_equality_and_bad_changes_are_misses() -> None:
    after = _after(_pay)
    pred = [
        {"path": "users.u1.balance", "type": "modified", "after": 20.0},
        {"path": "users.u1.name", "type": "modified", "after": "Ada L"},
    ]
    assert config_match(pred, BEFORE, after)  # EnvSimBench: 20.0 == 20
    assert not config_match(["users.u1.balance = 20"], BEFORE, after)
    assert not config_match(None, BEFORE, after)
    assert config_match([], BEFORE, BEFORE) and config_match("junk", BEFORE, BEFORE)


def test_pointer_predictions_are_read_as_dotted_paths() -> None:
    after = _after(_pay)
    pred = [
        {"op": "replace", "path": "/users/u1/balance", "before": 10, "after": 20},
        {"op": "replace", "path": "/users/u1/name", "before": "Ada", "after": "Ada L"},
    ]
    assert config_match(pred, BEFORE, after) and strict_config_match(pred, BEFORE, after)


def test_diff_dicts_is_their_change_list() -> None:
    after = _after(_pay)
    _delete_card(after)
    assert diff_dicts(BEFORE, after) == [
        {"path": "users.u1.balance", "type": "modified", "before": 10, "after": 20},
        {"path": "users.u1.cards.c1", "type": "removed", "before": {"amount": 5}, "after": None},
        {"path": "users.u1.name", "type": "modified", "before": "Ada", "after": "Ada L"},
    ]


# --- (b) their benchmark records ------------------------------------------------------------


@pytest.fixture(scope="module")
def steps() -> list[dict[str, Any]]:
    sampler = EpisodeSampler("airline", 0)
    return [s.to_dict() for s in sampler.steps(12, seed=3)]


def _record(step: dict[str, Any], n: int) -> dict[str, Any]:
    changes = diff_dicts(step["state_before"], step["state_after"])
    return {
        "task_info": {"task": f"episode {n}", "task_id": f"t{n}", "env_id": "airline-gen-0"},
        "env_code": "class AirlineEnv:\n    def " + step["tool"] + "(self, **kw): ...\n",
        "step_detail": {
            "action": {"name": step["tool"], "arguments": step["arguments"]},
            "observation": {"content": step["observation"]},
            "config_before": step["state_before"],
            "config_after": step["state_after"],
            "config_change": {"change_count": len(changes), "changes": changes},
        },
    }


def _perfect_envsimbench(sample: dict[str, Any]) -> Any:
    """Answers what EnvSimBench's own data teaches: feedback and its dotted changes."""

    async def predict(s: dict[str, Any]) -> str:
        changes = diff_dicts(s["state_before"], s["state_after"])
        return json.dumps({"feedback": s["observation"], "config_changes": changes})

    return predict


def test_a_record_is_a_step_sample_with_their_prompt(steps: list[dict[str, Any]]) -> None:
    step = next(s for s in steps if s["delta"])
    sample = check_sample(_record(step, 0))
    assert sample["tool"] == step["tool"] and sample["arguments"] == step["arguments"]
    assert sample["state_after"] == step["state_after"]
    assert (
        sample["labels"]["task_id"] == "t0" and sample["labels"]["group"] == step["labels"]["group"]
    )
    prompt = sample["prompt"][0]["content"]
    assert "class AirlineEnv" in prompt
    assert json.dumps(tool_call_text(step["tool"], step["arguments"]))[1:-1] in prompt


def test_their_failure_rule_labels_a_failure() -> None:
    record = {
        "step_detail": {
            "action": 'cancel({"id": "x"})',
            "observation": {"content": {"success": False, "error": "no such order"}},
            "config_before": {"orders": {}},
            "config_after": {"orders": {}},
        }
    }
    sample = check_sample(record)
    assert sample["tool"] == "cancel" and sample["arguments"] == {"id": "x"}
    assert sample["labels"]["group"] == "Failure"


@pytest.mark.parametrize(
    "record",
    [
        {"step_detail": {"action": 5, "config_before": {}, "config_after": {}}},
        {"step_detail": {"action": "noparens", "config_before": {}, "config_after": {}}},
        {"step_detail": {"action": {"name": "a"}, "config_before": [], "config_after": {}}},
    ],
)
def test_bad_records_are_sample_errors(record: dict[str, Any]) -> None:
    from factory.envsim.simulator import SampleError

    with pytest.raises(SampleError):
        from_record(record)


def test_evaluate_scores_a_file_of_records(
    steps: list[dict[str, Any]], tmp_path: Path, devserver: Any
) -> None:
    records = [_record(s, n) for n, s in enumerate(steps)]
    report = evaluate(records, _perfect_envsimbench({}), concurrency=3)
    assert len(report.results) == len(steps) and not report.invalid
    overall = report.overall
    deletions = sum(
        any(c["type"] == "removed" for c in diff_dicts(s["state_before"], s["state_after"]))
        for s in steps
    )
    assert overall.feedback_match == overall.config_match == overall.n
    assert overall.lenient_config_match == overall.n - deletions  # their metric, their gap
    # the command line reads their JSON file (a list of records) as it is
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(records))
    # against the development server, which simulates prompts of their layout perfectly
    # (on states of our domains): the scores are the in-process perfect predictor's
    server = devserver()
    out = tmp_path / "eval"
    argv = ["--samples", str(path), "--base-url", server.url, "--model", "factory-dev"]
    assert main([*argv, "--out", str(out), "--domain", "airline"]) == 0
    body = json.loads((out / "evaluation.json").read_text())
    assert body["samples"] == len(steps) and body["invalid_records"] == 0
    scored = body["overall"]
    assert scored["failed"] == 0 and scored["n"] == len(steps)
    assert scored["feedback_match"] == scored["config_match"] == len(steps)
    assert scored["lenient_config_match"] == overall.lenient_config_match
    assert server.stats()["by_kind"] == {"simulate_envsimbench": len(steps)}
    # a simulator that misses one change of every changing step fails their metric there
    dropping = devserver(sim_drop_change=1.0)
    out = tmp_path / "eval-drop"
    argv = ["--samples", str(path), "--base-url", dropping.url, "--model", "factory-dev"]
    assert main([*argv, "--out", str(out), "--domain", "airline"]) == 0
    scored = json.loads((out / "evaluation.json").read_text())["overall"]
    changing = sum(1 for s in steps if s["delta"])
    assert 0 < changing < len(steps)
    assert scored["config_match"] == len(steps) - changing
    assert scored["feedback_match"] == len(steps)


# --- (c) their SFT layout -------------------------------------------------------------------


def test_sft_rows_have_their_layout_and_read_back(steps: list[dict[str, Any]]) -> None:
    for step in steps:
        row = to_sft_row(step, env_code="def tool(): ...", facts="- now is 2024")
        assert set(row) == {"instruction", "input", "output"}
        assert "def tool(): ..." in row["instruction"] and "now is 2024" in row["instruction"]
        body = json.loads(row["input"])
        assert set(body) == {"initial_config", "tool_call"}
        assert body["initial_config"] == step["state_before"]
        assert body["tool_call"] == f"{step['tool']}({json.dumps(step['arguments'])})"
        answer = json.loads(row["output"])
        assert set(answer) == {"feedback", "config_changes"}
        assert answer["feedback"] == step["observation"]
        for change in answer["config_changes"]:
            assert set(change) == {"path", "type", "before", "after"}
            assert change["type"] in ("added", "removed", "modified")
            assert not change["path"].startswith("/")
        back = check_sample(row)
        assert back["state_after"] == step["state_after"] and back["tool"] == step["tool"]
        assert from_sft_row(row)["arguments"] == step["arguments"]
