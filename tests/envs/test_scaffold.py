"""``python -m factory.domain init``: a data-only pack from a domain nobody wrote one for.

The seeds are an office assistant's (calendar, email, files), written here; the
scaffolded pack then runs the amplification pipeline against the development server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.config import load_recipe
from factory.domain import main
from factory.envs.pack import load_domain
from factory.envs.scaffold import guess_kind
from tests.helpers import dev_overrides, read_rows


def _fn(name: str, description: str, **props: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in props.items()},
                "required": list(props),
            },
        },
    }


TOOLS = [
    _fn("list_events", "List the calendar events of a day.", date="string"),
    _fn("create_event", "Add an event to the calendar.", title="string", start="string"),
    _fn("send_email", "Send an email.", to="string", subject="string", body="string"),
    _fn("search_files", "Search the user's files by keyword.", query="string"),
    _fn("delete_file", "Delete a file by id.", file_id="string"),
    _fn("summarize_thread", "Summarize an email thread.", thread_id="string"),
]


def _call(name: str, **args: Any) -> dict[str, str]:
    return {"from": "function_call", "value": json.dumps({"name": name, "arguments": args})}


def _obs(value: Any) -> dict[str, str]:
    return {"from": "observation", "value": json.dumps(value)}


def _seed(turns: list[dict[str, str]], n: int) -> dict[str, Any]:
    return {
        "conversations": turns,
        "tools": json.dumps(TOOLS),
        "system": "You are an office assistant. Confirm before sending or deleting anything.",
        "metadata": {"id": f"office-{n}"},
    }


def office_seeds() -> list[dict[str, Any]]:
    h = lambda text: {"from": "human", "value": text}  # noqa: E731
    g = lambda text: {"from": "gpt", "value": text}  # noqa: E731
    return [
        _seed(
            [
                h("What's on my calendar on 2025-03-04?"),
                _call("list_events", date="2025-03-04"),
                _obs([{"id": "ev_104", "title": "Design review", "start": "2025-03-04T10:00"}]),
                g("You have one event: Design review at 10:00."),
            ],
            0,
        ),
        _seed(
            [
                h("Book a 1:1 with Priya on 2025-03-05 at 14:00."),
                _call("create_event", title="1:1 with Priya", start="2025-03-05T14:00"),
                _obs({"id": "ev_212", "title": "1:1 with Priya", "start": "2025-03-05T14:00"}),
                g("Done: the 1:1 with Priya is on your calendar for March 5 at 14:00."),
            ],
            1,
        ),
        _seed(
            [
                h("Email tom@acme.io that the report is late, subject 'Report'. Yes, send it."),
                _call("send_email", to="tom@acme.io", subject="Report", body="It is late."),
                _obs({"status": "sent", "message_id": "msg_881"}),
                g("Sent to tom@acme.io."),
            ],
            2,
        ),
        _seed(
            [
                h("Find my budget spreadsheet."),
                _call("search_files", query="budget"),
                _obs([{"file_id": "f_33", "name": "budget-2025.xlsx"}]),
                g("I found budget-2025.xlsx."),
            ],
            3,
        ),
        _seed(
            [
                h("Delete the file f_90, I confirm."),
                _call("delete_file", file_id="f_90"),
                _obs({"deleted": "f_90"}),
                g("f_90 is deleted."),
            ],
            4,
        ),
        _seed(
            [
                h("Summarize thread th_7 for me."),
                _call("summarize_thread", thread_id="th_7"),
                _obs({"summary": "Vendor asks to move the call to Friday."}),
                g("The vendor asks to move the call to Friday."),
            ],
            5,
        ),
    ]


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "user" / "office-seeds.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(s) + "\n" for s in office_seeds()))
    return path


def test_init_scaffolds_a_pack_and_says_what_to_review(
    seed_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "project"
    assert main(["init", "office", "--from-seeds", str(seed_file), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    tools = json.loads((root / "prompts/office/tools.json").read_text())
    kinds = {t["name"]: t["x-kind"] for t in tools}
    assert kinds == {
        "create_event": "write",
        "delete_file": "write",
        "list_events": "read",
        "search_files": "read",
        "send_email": "write",
        "summarize_thread": "generic",
    }
    assert all("guessed" in t["x-review"] for t in tools)
    assert tools[0]["parameters"]["required"]  # the seeds' JSON Schemas are kept
    assert "review before a large run" in out and "x-kind write guessed" in out
    assert "policy.md is a stub" in out
    assert "STUB" in (root / "prompts/office/policy.md").read_text()
    # the recipe loads and names the pack and the user's seed file
    cfg = load_recipe(root / "pipelines/office.yaml", [])
    domain = load_domain(cfg)
    assert domain.kinds == kinds and domain.rules is not None and not domain.rules.rules
    assert Path(cfg.resolve(cfg.seeds.path)).resolve() == seed_file.resolve()
    # a second init does not overwrite what the user may have edited
    assert main(["init", "office", "--from-seeds", str(seed_file), "--root", str(root)]) == 2
    assert "--force" in capsys.readouterr().err


def test_bad_name_and_seeds_without_tools_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seeds = tmp_path / "plain.jsonl"
    seeds.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    assert main(["init", "Office!", "--from-seeds", str(seeds), "--root", str(tmp_path)]) == 2
    assert main(["init", "office", "--from-seeds", str(seeds), "--root", str(tmp_path)]) == 3
    assert "no seed record has a tools column" in capsys.readouterr().err
    assert not (tmp_path / "prompts").exists()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("getInbox", "read"),
        ("calendar_add_attendee", "write"),
        ("think", "generic"),
        ("files.search", "read"),
    ],
)
def test_guess_kind(name: str, kind: str) -> None:
    assert guess_kind(name)[0] == kind


@pytest.mark.ray
def test_the_scaffolded_pack_amplifies_end_to_end(
    ray_session: Any, devserver: Any, seed_file: Path, tmp_path: Path
) -> None:
    root = tmp_path / "project"
    assert main(["init", "office", "--from-seeds", str(seed_file), "--root", str(root)]) == 0
    server = devserver()
    out = tmp_path / "out"
    cfg = load_recipe(
        root / "pipelines/office.yaml",
        [f"output.dir={out}", *dev_overrides(server.url, target=12)],
    )
    from factory.engine.runner import run

    result = run(cfg, out, progress=False)
    assert result.totals["accepted"] == 12
    rows = read_rows(out)
    assert len(rows) == 12
    names = {t["name"] for t in json.loads((root / "prompts/office/tools.json").read_text())}
    for row in rows:
        called = [
            json.loads(turn["value"])["name"]
            for turn in row["conversations"]
            if turn["from"] == "function_call"
        ]
        assert called and set(called) <= names
