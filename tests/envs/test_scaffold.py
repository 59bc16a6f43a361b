"""``python -m factory.domain init``: a data-only pack from a domain nobody wrote one for.

The seeds are an office assistant's (calendar, email, files), written here; the
scaffolded pack then runs the amplification pipeline against the development server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from factory import packs
from factory.domain import main
from factory.envs.pack import REVIEW_MARKER, load_domain, unreviewed
from factory.envs.scaffold import guess_kind
from factory.io.cache import ResponseCache
from factory.recipe import load_recipe
from factory.run import main as run_main
from tests.conftest import ROOT
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
    # Kinds from what each call did: a new id or an acknowledgment is a write, data a read.
    assert kinds == {
        "create_event": "write",  # returned the new id ev_212
        "delete_file": "write",  # answered only with its argument
        "list_events": "read",
        "search_files": "read",
        "send_email": "write",  # returned the new id msg_881
        "summarize_thread": "read",  # returned data its argument did not hold
    }
    review = {t["name"]: t["x-review"] for t in tools}
    assert "the new id 'ev_212'" in review["create_event"]
    assert "only acknowledge their arguments" in review["delete_file"]
    assert tools[0]["parameters"]["required"]  # the seeds' JSON Schemas are kept
    assert "review before a large run" in out and "x-kind write (the seeds' calls show it" in out
    # The seeds' own system prompt is the policy (the rows' system prompt), under a mark.
    policy = (root / "prompts/office/policy.md").read_text()
    assert "You are an office assistant. Confirm before sending or deleting anything." in policy
    assert REVIEW_MARKER in policy and "STUB" not in policy
    assert "policy.md is the seeds' own system prompt" in out
    # the recipe loads and names the pack and the user's seed file, paths as the README says
    cfg = load_recipe(root / "pipelines/office.yaml", [])
    domain = load_domain(cfg.domain)
    assert domain.kinds == kinds and domain.rules is not None and not domain.rules.rules
    assert Path(cfg.resolve(cfg.seeds.path)).resolve() == seed_file.resolve()
    assert cfg.output.dir == "out/office"  # relative to where the run starts
    assert cfg.resolve(cfg.amplify.prompt) == packs.folder("prompts") / "amplify.j2"
    # a second init does not overwrite what the user may have edited
    assert main(["init", "office", "--from-seeds", str(seed_file), "--root", str(root)]) == 2
    assert "--force" in capsys.readouterr().err


def test_a_run_refuses_the_pack_until_it_is_reviewed(
    seed_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "project"
    assert main(["init", "office", "--from-seeds", str(seed_file), "--root", str(root)]) == 0
    recipe = root / "pipelines/office.yaml"
    capsys.readouterr()
    assert run_main([str(recipe), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    for rel in ("prompts/office/tools.json", "prompts/office/policy.md", "filters/office.yaml"):
        assert str(root / rel) in err
    assert str(recipe) in err and "--allow-unreviewed" in err
    assert not (tmp_path / "out").exists()  # nothing started
    assert run_main([str(recipe), "--dry-run"]) == 0  # a plan is free: it only notes them
    assert "still holds x-review marks" in capsys.readouterr().err
    review(root)
    assert unreviewed((done := load_recipe(recipe)).domains(), done.source) == []


def review(root: Path) -> None:
    """What the person does: read every marked file, then delete the marks."""
    for file in [*root.rglob("*.json"), *root.rglob("*.md"), *root.rglob("*.yaml")]:
        text = file.read_text()
        if file.suffix == ".json":
            tools = [{k: v for k, v in t.items() if k != REVIEW_MARKER} for t in json.loads(text)]
            file.write_text(json.dumps(tools, indent=2))
        else:
            kept = [line for line in text.splitlines(keepends=True) if REVIEW_MARKER not in line]
            file.write_text("".join(kept))


def test_seeds_without_a_system_prompt_give_a_pack_without_a_policy(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.jsonl"
    bare = [{k: v for k, v in s.items() if k != "system"} for s in office_seeds()]
    seeds.write_text("".join(json.dumps(s) + "\n" for s in bare))
    root = tmp_path / "project"
    assert main(["init", "office", "--from-seeds", str(seeds), "--root", str(root)]) == 0
    assert not (root / "prompts/office/policy.md").exists()
    cfg = load_recipe(root / "pipelines/office.yaml", [])
    assert cfg.domain.policy is None and load_domain(cfg.domain).policy == ""


def test_behaviour_kinds_of_the_shipped_seeds_are_the_packs_kinds() -> None:
    """On seeds whose kinds a person wrote, what the calls show agrees with them."""
    from factory.core.trajectory import Trajectory
    from factory.envs.kinds import observed_kinds
    from factory.envs.registry import get_plugin
    from factory.io.readers import read_seeds

    for name in ("airline", "retail"):
        seeds = [
            t
            for t in read_seeds(ROOT / "seeds" / name / "seeds.jsonl")
            if isinstance(t, Trajectory)
        ]
        pack = get_plugin(name).pack
        assert pack is not None
        kinds = load_domain_pack(name).kinds
        shown = {tool: e.verdict() for tool, e in observed_kinds(seeds).items()}
        wrong = {
            t: (v, kinds[t])
            for t, v in shown.items()
            if v and kinds[t] != "generic" and v[0] != kinds[t]
        }
        assert not wrong and len(shown) >= 10


def load_domain_pack(name: str) -> Any:
    from factory.envs.pack import domain_from_pack
    from factory.envs.registry import get_plugin

    pack = get_plugin(name).pack
    assert pack is not None
    return domain_from_pack(name, pack)


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
    review(root)
    server = devserver()
    out = tmp_path / "out"
    overrides = [f"output.dir={out}", *dev_overrides(server.url, target=12)]
    cfg = load_recipe(root / "pipelines/office.yaml", overrides)
    from factory.engine.runner import run

    result = run(cfg, out, progress=False)
    assert result.totals["accepted"] == 12
    rows = read_rows(out)
    assert len(rows) == 12
    # every row's system prompt is the seeds' own, not a stub
    system = "You are an office assistant. Confirm before sending or deleting anything."
    assert {row["system"].strip() for row in rows} == {system}
    # The person edits the policy and starts over: before paying, the run says how many
    # of the folder's cached answers its new prompts cannot use.
    policy = root / "prompts/office/policy.md"
    policy.write_text(policy.read_text() + "Never share a file outside the company.\n")
    cached = len(ResponseCache(str(out / "cache")))
    again = run(
        load_recipe(root / "pipelines/office.yaml", overrides), out, progress=False, fresh=True
    )
    assert again.totals["accepted"] == 12
    log = (out / "logs" / "run.log").read_text()
    assert "the amplify prompts changed since this folder's last run" in log
    said = re.search(r"its (\d+) cached amplify answers no longer apply", log)
    assert said is not None and 12 <= int(said[1]) < cached
    names = {t["name"] for t in json.loads((root / "prompts/office/tools.json").read_text())}
    for row in rows:
        called = [
            json.loads(turn["value"])["name"]
            for turn in row["conversations"]
            if turn["from"] == "function_call"
        ]
        assert called and set(called) <= names
