"""Multi-app composition: rules as data, the companions of a call, the validator's codes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from factory.core.compose import COMPOSE_CODES, CompositionRules, apps_used, companions
from factory.core.formats.textaction import parse
from factory.core.grammar import ActionGrammar
from factory.core.trajectory import Trajectory
from factory.core.validate import validate
from factory.errors import ConfigError
from tests.conftest import ROOT

PACK = ROOT / "prompts" / "office"
GRAMMAR = ActionGrammar.load(PACK / "grammar.yaml")
RULES = CompositionRules.load(PACK / "compose.yaml", GRAMMAR)
RAW = yaml.safe_load((PACK / "compose.yaml").read_text())
SHEET = "/home/office/Spreadsheets/costs.xlsx"


def act(call: str) -> str:
    return f"Think: next.\n\nAct: {call}"


def episode(task: str, *steps: str) -> Trajectory:
    msgs = [{"role": "user", "content": task}]
    for i, text in enumerate(steps):
        msgs.append({"role": "assistant" if i % 2 == 0 else "tool", "content": text})
    return parse({"messages": msgs}, grammar=GRAMMAR)


READ_MAIL = act('email.read(message_id="m-7")')
MAIL = "From: ana@x.example\nDate: 2024-05-06\n\nThe taxi cost 38.50 on 2024-05-03."
APPEND = act(f'sheets.append_row(path="{SHEET}", values=["2024-05-03", "Taxi", 38.50])')

GOOD = episode(
    f"Read message m-7 and log the taxi it mentions in {SHEET}.",
    READ_MAIL, MAIL, APPEND, f"Appended row 4 to {SHEET}", act("finish"),
)  # fmt: skip
CASES = {
    "too_few_apps": episode(
        "Read message m-7.", READ_MAIL, MAIL, act('answer("38.50")')
    ),
    "invalid_path": episode(
        "Read message m-7 and log it in /tmp/costs.xlsx.",
        READ_MAIL, MAIL,
        act('sheets.append_row(path="/tmp/costs.xlsx", values=["2024-05-03", 38.50])'),
        "Appended row 2", act("finish"),
    ),
    "ungrounded_value": episode(
        f"Read message m-7 and log it in {SHEET}.",
        READ_MAIL, MAIL,
        act(f'sheets.append_row(path="{SHEET}", values=["2024-05-03", 99.99])'),
        "Appended row 2", act("finish"),
    ),
    "no_app_flow": episode(
        f"Read message m-7. Then log a taxi of 12.00 on 2024-05-09 in {SHEET}.",
        READ_MAIL, MAIL,
        act(f'sheets.append_row(path="{SHEET}", values=["2024-05-09", 12.00])'),
        "Appended row 2", act("finish"),
    ),
}  # fmt: skip


def test_a_composed_episode_passing_a_value_between_apps_is_valid() -> None:
    assert apps_used(GOOD, GRAMMAR) == ["email", "sheets"]
    assert RULES.check(GOOD, GRAMMAR) == []
    assert validate(GOOD, grammar=GRAMMAR, compose=RULES) == []


def test_every_composition_code_has_a_case() -> None:
    assert set(CASES) == set(COMPOSE_CODES)


@pytest.mark.parametrize("code", COMPOSE_CODES)
def test_every_composition_code_is_reachable(code: str) -> None:
    issues = validate(CASES[code], grammar=GRAMMAR, compose=RULES)
    assert issues and issues[0].code == code, issues


def test_authored_arguments_and_created_paths_need_no_source() -> None:
    new_doc = "/home/office/Documents/taxi.docx"
    traj = episode(
        "Read message m-7 and write the taxi cost into a new document.",
        READ_MAIL, MAIL,
        act(f'docs.create(path="{new_doc}", text="Taxi: 38.50 EUR, paid by card")'),
        f"Created {new_doc}", act("finish"),
    )  # fmt: skip
    assert [i.code for i in RULES.check(traj, GRAMMAR)] == ["no_app_flow"]  # authored text only


def test_validation_of_a_seed_skips_the_composition() -> None:
    assert validate(CASES["too_few_apps"], grammar=GRAMMAR) == []


@pytest.mark.parametrize(
    ("mutate", "key_path"),
    [
        (lambda r: r.update(bogus=1), "bogus"),
        (lambda r: r["apps"].update(fax="a fax machine"), "apps.fax"),
        (lambda r: r.update(min_apps=1), "min_apps"),
        (lambda r: r.update(min_apps=4, max_apps=3), "min_apps"),
        (lambda r: r.update(authored=["email.send.cc"]), "authored[0]"),
        (lambda r: r["paths"].update(pattern="("), "paths.pattern"),
        (lambda r: r["paths"]["created_by"].append("docs.shred"), "paths.created_by[1]"),
        (lambda r: r["flows"][0].update({"to": "fax"}), "flows[0].to"),
        (lambda r: r.update(require_flow="yes"), "require_flow"),
    ],
)
def test_malformed_rules_name_their_key_path(mutate: Any, key_path: str) -> None:
    raw = copy.deepcopy(RAW)
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        CompositionRules.from_dict(raw, GRAMMAR)
    assert err.value.key_path == key_path


def test_a_rules_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text("apps: {email: x}\n")
    with pytest.raises(ConfigError, match=r"compose\.yaml: apps"):
        CompositionRules.load(path, GRAMMAR)


def test_companions_come_from_other_apps_and_repeat_for_the_same_call() -> None:
    seed_apps = {f"{app}-{n}": [app] for app in RULES.apps for n in range(3)}
    seen_counts = set()
    for call in range(40):
        picked = companions("email-0", seed_apps, RULES, call, seed=7)
        apps = [seed_apps[p][0] for p in picked]
        assert "email" not in apps and len(set(apps)) == len(apps)
        assert RULES.min_apps - 1 <= len(picked) <= RULES.max_apps - 1
        assert picked == companions("email-0", seed_apps, RULES, call, seed=7)
        seen_counts.add(len(picked))
    assert seen_counts == {1, 2}  # 2 and 3 apps per task both occur
    assert companions("email-0", {"email-0": ["email"]}, RULES, 0, seed=7) == []
