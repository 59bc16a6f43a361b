"""The judge's unusable answer is retried with a new request, bounded and recorded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from factory.engine.stages.base import FAILED, OK, make_row
from factory.llm import Completion, Usage
from factory.llm.backends import OnlineBackend
from factory.recipe import load_recipe
from tests.conftest import ROOT

CFG = load_recipe(ROOT / "pipelines" / "airline.yaml")


class Judge(OnlineBackend):
    """Answers from a script, one text per request, and records the request ids."""

    model = "m"

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.ids: list[str] = []

    async def complete(self, request: Any) -> Completion:
        self.ids.append(request.request_id)
        return Completion(
            text=self.answers[min(len(self.ids), len(self.answers)) - 1],
            reasoning=None,
            usage=Usage(input=100, output=10),
            cost_usd=0.5,
            endpoint="fake",
            attempts=1,
            latency_s=0.0,
            model="m",
            system_fingerprint=None,
        )


def judge_row(*answers: str, requests: int = 3) -> tuple[dict[str, Any], Judge]:
    from factory.core.formats import parse_record
    from factory.engine.prompts import PromptTemplate
    from factory.engine.stages.prefilter import PrefilterStage
    from factory.envs.pack import load_domain

    stage = PrefilterStage.__new__(PrefilterStage)
    stage.model, stage.sampling = "m", {}
    stage.verdict_requests = requests
    stage.template = PromptTemplate(CFG.resolve(CFG.prefilter.prompt), load_domain(CFG.domain))
    judge = Judge(*answers)
    stage.backend = judge
    seed = json.loads((ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[0])
    row = make_row(record=parse_record(seed, source="t:0").to_json())
    return asyncio.run(stage.arun_one(row)), judge


def test_a_malformed_verdict_is_retried_with_a_new_request() -> None:
    row, judge = judge_row("I think it is fine", '{"keep": true, "reasons": []}')
    assert row["status"] == OK
    assert len(judge.ids) == 2 and len(set(judge.ids)) == 2  # a new request, its own id
    assert json.loads(row["retries"]) == {"unparsable_completion": 1}
    # both answers were paid for: both are counted
    assert json.loads(row["usage"])["prompt_tokens"] == 200
    assert row["cost_usd"] == 1.0 and row["attempts"] == 2


def test_the_same_retry_sequence_on_every_run() -> None:
    """Request ids are a function of the seed and the retry number, so a resume replays
    the same requests from the cache."""
    _, first = judge_row("no", "still no", '{"keep": false, "reasons": ["x"]}')
    _, again = judge_row("no", "still no", '{"keep": false, "reasons": ["x"]}')
    assert first.ids == again.ids and len(set(first.ids)) == 3


def test_the_seed_fails_only_after_its_last_request() -> None:
    row, judge = judge_row("nope", requests=3)
    assert row["status"] == FAILED and row["reason"] == "unparsable_completion"
    assert len(judge.ids) == 3 and "after 3 requests" in row["message"]
    assert json.loads(row["retries"]) == {"unparsable_completion": 2}
    assert row["cost_usd"] == 1.5
