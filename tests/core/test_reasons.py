"""Every reason code in the registry is reachable from a crafted bad input.

Each case builds one bad input and pushes it through the public entry point a
real run uses (reader, seed check stage, structure check, collector, LLM
stages with a scripted client), then asserts the code that comes out.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from factory.core.export import check_structure
from factory.core.reasons import REASONS
from factory.engine.stages.base import Stage, make_row
from factory.engine.stages.seeds import raw_record_rows
from factory.errors import LLMBadRequest, LLMRateLimited, LLMServerError, LLMTimeout
from factory.io.readers import records_from_bytes
from factory.io.writer import Manifest
from factory.llm.backends import OnlineBackend
from factory.recipe import load_recipe
from tests.conftest import ROOT

CFG = load_recipe(ROOT / "pipelines" / "airline.yaml")
SEED = json.loads((ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[0])


def _stage():
    from tests.helpers import seed_check_stage

    return seed_check_stage(CFG)


def via_reader(name: str, data: bytes) -> str:
    rows = list(raw_record_rows(records_from_bytes(name, data)))
    row = rows[0] if rows[0]["status"] != "ok" else _stage().run_one(rows[0])
    return row["reason"]


def via_seed_check(record: Any, **stage_kw: Any) -> str:
    from tests.helpers import seed_check_stage

    stage = seed_check_stage(CFG)
    for k, v in stage_kw.items():
        setattr(stage, k, v)
    row = make_row(source="t:0", record=json.dumps(record))
    return stage.run_one(row)["reason"]


def seed_with(index: int, value: str, field: str = "value") -> dict:
    rec = copy.deepcopy(SEED)
    rec["conversations"][index][field] = value
    return rec


def call_value(name: str, args: Any) -> str:
    return json.dumps({"name": name, "arguments": args})


FIRST_CALL = next(i for i, m in enumerate(SEED["conversations"]) if m["from"] == "function_call")
FIRST_OBS = FIRST_CALL + 1


def structure(convs: list[tuple[str, str]]) -> str:
    issues = check_structure([{"from": f, "value": v} for f, v in convs])
    return issues[0].code


class ScriptedClient(OnlineBackend):
    """Answers with a fixed text or raises a fixed error (the stage's LLM boundary)."""

    model = "m"

    def __init__(self, outcome: Any):
        self.outcome = outcome

    async def complete(self, request):
        from factory.llm import Completion, Usage

        if isinstance(self.outcome, Exception):
            raise self.outcome
        return Completion(
            text=self.outcome,
            reasoning=None,
            usage=Usage(),
            cost_usd=0.0,
            endpoint="fake",
            attempts=1,
            latency_s=0.0,
            model="m",
            system_fingerprint=None,
        )


def via_prefilter(outcome: Any) -> str:
    from factory.engine.stages.prefilter import PrefilterStage

    stage = PrefilterStage.__new__(PrefilterStage)
    stage.model, stage.sampling = "m", {}
    from factory.engine.prompts import PromptTemplate
    from factory.envs.pack import load_domain

    stage.template = PromptTemplate(CFG.resolve(CFG.prefilter.prompt), load_domain(CFG.domain))
    stage.backend = ScriptedClient(outcome)
    from factory.core.formats import parse_record

    traj = parse_record(SEED, source="t:0")
    row = make_row(record=traj.to_json())
    return asyncio.run(stage.arun_one(row))["reason"]


def via_postprocess(completion: str) -> str:
    from tests.helpers import postprocess_stage

    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml")
    row = make_row(completion=completion, seed_id="s", source="s#0")
    return postprocess_stage(cfg).run_one(row)["reason"]


OS_CFG = load_recipe(ROOT / "pipelines" / "os.yaml")
OFFICE_CFG = load_recipe(ROOT / "pipelines" / "office-compose.yaml")
BASH = "Think: look.\n\nAct: bash\n\n```bash\nls /srv\n```"
ANSWER = "Think: done.\n\nAct: answer(2)"


def via_text_seed(*turns: tuple[str, str]) -> str:
    """An OS-agent seed (``from``/``value`` pairs) through the OS recipe's seed check."""
    from tests.helpers import seed_check_stage

    record = {"conversations": [{"from": f, "value": v} for f, v in turns]}
    row = make_row(source="t:0", record=json.dumps(record))
    return seed_check_stage(OS_CFG).run_one(row)["reason"]


def via_composition(task: str, *steps: str) -> str:
    """A composed office episode (assistant and tool texts in turn) through postprocess."""
    from tests.helpers import postprocess_stage

    roles = ("assistant", "tool")
    messages = [{"role": "user", "content": task}]
    messages += [{"role": roles[i % 2], "content": text} for i, text in enumerate(steps)]
    row = make_row(completion=json.dumps({"messages": messages}), seed_id="s", source="s#0")
    return postprocess_stage(OFFICE_CFG).run_one(row)["reason"]


SHEET = "/home/office/Spreadsheets/costs.xlsx"
READ_MAIL = 'Think: read.\n\nAct: email.read(message_id="m-7")'
MAIL = "From: ana@x.example\n\nThe taxi cost 38.50 on 2024-05-03."


def append(path: str, *values: Any) -> str:
    return (
        f"Think: log.\n\nAct: sheets.append_row(path={json.dumps(path)}, values={list(values)!r})"
    )


class Boom(Stage):
    name = "boom"

    def process(self, row):
        raise ValueError("bug")


def duplicate() -> str:
    from factory.engine.collect import Collector

    tmp = Path(__import__("tempfile").mkdtemp())
    c = Collector(tmp, Manifest("r", "h"), dataset_name="d")
    row = make_row(
        id="x",
        output=json.dumps(
            {"conversations": [], "system": "", "tools": "", "id": "x", "meta": "{}"}
        ),
    )
    c.add(dict(row))
    second = dict(row)
    c.add(second)  # the collector marks the later copy a reject of stage dedup
    assert second["stage"] == "dedup"
    return str(second["reason"])


def near_duplicate() -> str:
    from factory.core.neardup import NearDupIndex, NearDupParams, signature_bytes
    from factory.core.trajectory import Trajectory, Turn
    from factory.engine.collect import Collector

    params = NearDupParams()
    sig = signature_bytes(Trajectory(turns=[Turn("user", "change my flight to boston")]), params)
    tmp = Path(__import__("tempfile").mkdtemp())
    c = Collector(tmp, Manifest("r", "h"), dataset_name="d", neardup=NearDupIndex(params))
    rows = []
    for rid in ("x", "y"):
        out = {"conversations": [], "system": "", "tools": "", "id": rid, "meta": "{}"}
        rows.append(make_row(id=rid, output=json.dumps(out), minhash=sig))
        c.add(rows[-1])
    assert rows[1]["stage"] == "neardup"
    return str(rows[1]["reason"])


def contaminated() -> str:
    from factory.core.decontam import Decontaminator
    from factory.core.trajectory import Trajectory, Turn

    d = Decontaminator([("t", "you want a refund for the whole trip now")], n=3)
    issue = d.check(Trajectory(turns=[Turn("user", "You want a refund for the whole trip now")]))
    assert issue is not None
    return issue.code


def deep(n: int) -> Any:
    value: Any = "x"
    for _ in range(n):
        value = [value]
    return value


CASES: dict[str, Any] = {
    "unreadable_bytes": lambda: via_reader("a.jsonl", b"\xff\xfe\x80\n"),
    "invalid_json": lambda: via_reader("a.jsonl", b'{"conversations": [\n'),
    "unreadable_file": lambda: via_reader("a.parquet", b"PAR1 but not really"),
    "not_an_object": lambda: via_reader("a.jsonl", b"[1, 2]\n"),
    "unknown_format": lambda: via_seed_check({"dialogue": []}),
    "bad_role": lambda: via_seed_check(seed_with(0, "wizard", "from")),
    "bad_field_type": lambda: via_seed_check({"conversations": "not a list"}),
    "bad_tools": lambda: via_seed_check({**SEED, "tools": "not json at all"}),
    "empty_trajectory": lambda: via_seed_check({"conversations": []}),
    "too_large": lambda: via_seed_check({**SEED, "metadata": {"deep": deep(200)}}),
    "malformed_arguments": lambda: via_seed_check(
        seed_with(FIRST_CALL, '{"name": "get_user_details", "arguments": {"user_id": ')
    ),
    "arguments_not_object": lambda: via_seed_check(
        seed_with(FIRST_CALL, call_value("get_user_details", [1, 2]))
    ),
    "malformed_observation": lambda: via_seed_check(seed_with(FIRST_OBS, '{"name": {"first": ')),
    "unknown_tool": lambda: via_seed_check(seed_with(FIRST_CALL, call_value("fly_me", {}))),
    "missing_argument": lambda: via_seed_check(
        seed_with(FIRST_CALL, call_value("get_user_details", {}))
    ),
    "unknown_argument": lambda: via_seed_check(
        seed_with(FIRST_CALL, call_value("get_user_details", {"user_id": "a_b_1", "x": 1}))
    ),
    "wrong_type": lambda: via_seed_check(
        seed_with(FIRST_CALL, call_value("get_user_details", {"user_id": 7}))
    ),
    "enum_violation": lambda: via_seed_check(
        seed_with(
            FIRST_CALL,
            call_value(
                "update_reservation_flights",
                {
                    "reservation_id": "ABC123",
                    "cabin": "first",
                    "payment_id": "credit_card_4412907",
                    "flights": [{"flight_number": "HAT001", "date": "2024-05-22"}],
                },
            ),
        )
    ),
    "schema_violation": lambda: via_seed_check(
        seed_with(
            FIRST_CALL,
            call_value("send_certificate", {"user_id": "lena_okafor_7314", "amount": -5}),
        )
    ),
    "bad_turn_order": lambda: structure([("gpt", "hi"), ("human", "x")]),
    "no_assistant_ending": lambda: structure([("human", "x")]),
    "unanswered_call": lambda: structure(
        [("human", "x"), ("function_call", call_value("t", {})), ("human", "y"), ("gpt", "z")]
    ),
    "orphan_observation": lambda: structure(
        [("human", "x"), ("gpt", "a"), ("observation", "o"), ("gpt", "z")]
    ),
    "empty_turn": lambda: structure([("human", ""), ("gpt", "z")]),
    "bad_function_call": lambda: structure([("human", "x"), ("function_call", "not json")]),
    "stray_think_tag": lambda: structure([("human", "x"), ("gpt", "ok </think> done")]),
    "duplicate": duplicate,
    "near_duplicate": near_duplicate,
    "contaminated": contaminated,
    "reward_below_min": lambda: via_seed_check({**SEED, "reward": 0.0}, min_reward=1.0),
    "prefilter_rejected": lambda: via_prefilter('{"keep": false, "reasons": ["incomplete"]}'),
    "unparsable_completion": lambda: via_postprocess("I cannot help with that."),
    "llm_failed": None,  # umbrella code for docs; every failure carries its specific llm_* code
    "llm_timeout": lambda: via_prefilter(LLMTimeout("slow")),
    "llm_rate_limited": lambda: via_prefilter(LLMRateLimited("429", retry_after=1.0)),
    "llm_server_error": lambda: via_prefilter(LLMServerError("500")),
    "llm_bad_request": lambda: via_prefilter(LLMBadRequest("400")),
    "internal_error": lambda: Boom().run_one(make_row(record="{}"))["reason"],
    "no_action": lambda: via_text_seed(("human", "Count."), ("gpt", "Think: no idea.")),
    "unknown_action": lambda: via_text_seed(
        ("human", "Count."),
        ("gpt", "Act: python\n\n```python\n1\n```"),
        ("human", "1"),
        ("gpt", ANSWER),
    ),
    "malformed_action": lambda: via_text_seed(("human", "Count."), ("gpt", "Act: answer(2")),
    "multiple_actions": lambda: via_text_seed(
        ("human", "Count."), ("gpt", BASH + "\nAct: finish"), ("human", "a"), ("gpt", ANSWER)
    ),
    "answer_not_last": lambda: via_text_seed(
        ("human", "Count."), ("gpt", ANSWER), ("human", "sure?"), ("gpt", ANSWER)
    ),
    "action_without_observation": lambda: via_text_seed(
        ("human", "Count."), ("gpt", BASH), ("gpt", ANSWER)
    ),
    "observation_without_action": lambda: via_text_seed(
        ("human", "Count."),
        ("gpt", BASH),
        ("observation", "a"),
        ("observation", "b"),
        ("gpt", ANSWER),
    ),
    "too_few_apps": lambda: via_composition(
        "Read message m-7.", READ_MAIL, MAIL, 'Think: ok.\n\nAct: answer("38.50")'
    ),
    "invalid_path": lambda: via_composition(
        "Read m-7 and log it in /tmp/c.xlsx.",
        READ_MAIL,
        MAIL,
        append("/tmp/c.xlsx", "2024-05-03", 38.5),
        "Appended",
        "Think: ok.\n\nAct: finish",
    ),
    "ungrounded_value": lambda: via_composition(
        f"Read m-7 and log it in {SHEET}.",
        READ_MAIL,
        MAIL,
        append(SHEET, "2024-05-03", 99.99),
        "Appended",
        "Think: ok.\n\nAct: finish",
    ),
    "no_app_flow": lambda: via_composition(
        f"Read m-7, then log 12.00 on 2024-05-09 in {SHEET}.",
        READ_MAIL,
        MAIL,
        append(SHEET, "2024-05-09", 12.0),
        "Appended",
        "Think: ok.\n\nAct: finish",
    ),
    "bad_step_sample": None,  # covered by the simulator evaluation tests
    "contradicts_executor": None,  # covered with the grounding tests (envsim/test_grounding.py)
}


def test_every_registered_code_has_a_case() -> None:
    assert set(CASES) == set(REASONS)


@pytest.mark.parametrize("code", sorted(c for c, f in CASES.items() if f is not None))
def test_reason_is_reachable(code: str) -> None:
    assert CASES[code]() == code


def test_domain_rule_codes_are_reachable() -> None:
    got = via_seed_check(seed_with(FIRST_CALL, call_value("get_user_details", {"user_id": "Lena"})))
    assert got.startswith("domain:")
