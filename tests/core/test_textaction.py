"""Text-action seeds and completions read with a domain's grammar (``formats/textaction``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory.core.decontam import Decontaminator
from factory.core.formats import parse_record
from factory.core.formats.textaction import parse, parse_completion, render_messages
from factory.core.grammar import ActionGrammar
from factory.core.neardup import NearDupIndex, NearDupParams, signature_bytes
from factory.core.trajectory import ToolCall
from factory.errors import RepairError, SeedFormatError
from factory.io.readers import iter_records
from tests.conftest import ROOT

OS = ActionGrammar.load(ROOT / "prompts" / "os" / "grammar.yaml")
BASH = "Think: look.\n\nAct: bash\n\n```bash\nls /srv\n```"
ANSWER = "Think: two.\n\nAct: answer(2)"


def sharegpt(*values: str, system: str | None = None) -> dict[str, Any]:
    roles = ["human", "gpt"]
    record: dict[str, Any] = {
        "conversations": [{"from": roles[i % 2], "value": v} for i, v in enumerate(values)]
    }
    if system is not None:
        record["system"] = system
    return record


def test_agentbench_layout_turns_human_turns_after_an_action_into_observations() -> None:
    traj = parse_record(
        sharegpt("How many entries in /srv?", BASH, "a\nb", ANSWER), source="s:0", grammar=OS
    )
    assert [t.role for t in traj.turns] == ["user", "assistant", "tool", "assistant"]
    assert traj.turns[1].tool_calls == [ToolCall("bash", {"script": "ls /srv"})]
    assert traj.turns[1].content == BASH  # the agent's text is kept whole
    assert traj.turns[2].name == "bash" and traj.turns[3].tool_calls[0].arguments == {"value": 2}
    assert traj.tools == [] and traj.metadata["format"] == "textaction"


def test_openai_messages_and_explicit_observations() -> None:
    record = {
        "messages": [
            {"role": "system", "content": "You are an OS agent."},
            {"role": "user", "content": "Count."},
            {"role": "assistant", "content": BASH},
            {"role": "tool", "content": "a"},
            {"role": "user", "content": "Only files, please."},
            {"role": "assistant", "content": ANSWER},
        ]
    }
    traj = parse(record, grammar=OS)
    assert traj.system == "You are an OS agent."
    # with observation roles in the layout, a human turn stays the user's
    assert [t.role for t in traj.turns] == ["user", "assistant", "tool", "user", "assistant"]


def test_repairs_are_recorded_with_their_place() -> None:
    sloppy = "Think: look.\nAct:bash\n```sh\nls /srv"
    traj = parse(sharegpt("Count.", sloppy, "a", ANSWER), grammar=OS)
    assert traj.turns[1].content == BASH.replace("\n\nAct", "\nAct")
    assert traj.metadata["repairs"] == [
        "conversations[1]: fence_language",
        "conversations[1]: close_fence",
        "conversations[1]: action_whitespace",
    ]


def test_think_blocks_become_reasoning() -> None:
    traj = parse(sharegpt("Count.", f"<think>plan</think>{ANSWER}"), grammar=OS)
    assert traj.turns[1].reasoning == "plan" and traj.turns[1].content == ANSWER


def test_a_broken_action_keeps_its_text_and_no_call() -> None:
    traj = parse(sharegpt("Count.", "Act: python\nprint(1)", "1", ANSWER), grammar=OS)
    assert traj.turns[1].tool_calls == [] and traj.turns[2].role == "tool"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
             "tool_calls": [{"name": "bash", "arguments": {}}]}]},
            "bad_field_type",
        ),
        ({"conversations": [{"from": "wizard", "value": "x"}]}, "bad_role"),
        (sharegpt("x", ANSWER) | {"conversations": [{"from": "gpt", "value": ANSWER},
         {"from": "system", "value": "late"}]}, "bad_role"),
        ({"conversations": [{"from": "system", "value": "only"}]}, "empty_trajectory"),
    ],
)  # fmt: skip
def test_layout_problems_are_seed_errors(record: dict[str, Any], reason: str) -> None:
    with pytest.raises(SeedFormatError) as err:
        parse_record(record, source="s:1", grammar=OS)
    assert err.value.reason == reason


def test_completions_round_trip_through_the_prompt_format() -> None:
    traj = parse(sharegpt("Count.", BASH, "a\nb", ANSWER), grammar=OS)
    shown = render_messages(traj)
    assert [m["role"] for m in shown["messages"]] == ["user", "assistant", "tool", "assistant"]
    text = "```json\n" + json.dumps(shown) + "\n```"
    back = parse_completion(text, OS)
    assert back.turns == traj.turns and back.metadata["format"] == "completion"
    assert back.metadata["repairs"] == ["completion:json_repair"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no JSON at all", "unparsable_completion"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "bad_role"),
        ('{"messages": [{"role": "user", "content": 3}]}', "bad_field_type"),
    ],
)
def test_unreadable_completions_carry_a_reason(text: str, reason: str) -> None:
    with pytest.raises(RepairError) as err:
        parse_completion(text, OS)
    assert err.value.reason == reason


def test_seeds_read_from_parquet_like_any_other_container(tmp_path: Path) -> None:
    lines = (ROOT / "seeds" / "os" / "seeds.jsonl").read_text().splitlines()[:5]
    pq.write_table(pa.Table.from_pylist([json.loads(x) for x in lines]), tmp_path / "s.parquet")
    for raw, line in zip(iter_records(tmp_path / "s.parquet"), lines, strict=True):
        from_parquet = parse_record(raw.record, source="p", grammar=OS)
        from_jsonl = parse_record(json.loads(line), source="j", grammar=OS)
        assert from_parquet.content_id() == from_jsonl.content_id()


def test_dedup_near_duplicates_and_decontamination_see_text_actions() -> None:
    task = "How many entries does the directory /srv/data/exports have in total right now?"
    first = parse(sharegpt(task, BASH, "a\nb", ANSWER), grammar=OS)
    renamed = parse(sharegpt(task.replace("exports", "imports"), BASH, "a\nb", ANSWER), grammar=OS)
    other = parse(
        sharegpt("Which kernel is running?", BASH.replace("ls /srv", "uname -r"), "6.1", ANSWER),
        grammar=OS,
    )
    assert first.content_id() != renamed.content_id()  # exact dedup tells them apart
    for view in ("user", "tools"):
        index = NearDupIndex(NearDupParams(view=view, threshold=0.5))
        assert index.check("a", signature_bytes(first, index.params)) is None
        near = index.check("b", signature_bytes(renamed, index.params))
        assert near is not None and near.code == "near_duplicate"
        assert index.check("c", signature_bytes(other, index.params)) is None
    benchmark = Decontaminator([("os-17", task)], n=6)
    flagged = benchmark.check(first)
    assert flagged is not None and flagged.code == "contaminated"
    assert benchmark.check(other) is None
