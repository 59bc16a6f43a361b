"""LLM pre-filter: a judge decides which valid seeds are worth amplifying.

Runs only on seeds that passed every rule (``SeedCheckStage``), so the LLM is
never paid to look at a seed the rules already refuse. The verdict is kept on
the row, accepted or not, so a rejected seed says why.

An answer without a usable verdict is retried like an amplification call that
failed to parse: with a new request (its id names the retry, so the cache keeps
both answers and a resume replays the same sequence), up to
``prefilter.verdict_requests`` requests; every request's tokens and cost stay on
the row, and the retries are counted under ``unparsable_completion``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from factory.core.repair import parse_json_value
from factory.core.trajectory import Trajectory
from factory.engine.prompts import PromptTemplate
from factory.engine.settings import LLMStageSettings, PromptFile
from factory.engine.stages.base import fail, reject
from factory.engine.stages.llm_stage import LLMStage, add_retries, render
from factory.envs.pack import Domain
from factory.errors import RepairError

__all__ = ["PrefilterStage", "build_prefilter", "parse_verdict"]


def parse_verdict(text: str) -> dict[str, Any]:
    """The judge's JSON verdict; ``keep`` must be a boolean.

    Raises:
        RepairError: ``unparsable_completion`` when there is no usable verdict.
    """
    try:
        value, _ = parse_json_value(text)
    except RepairError as exc:
        raise RepairError("unparsable_completion", f"verdict is not JSON: {exc}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("keep"), bool):
        raise RepairError("unparsable_completion", "verdict lacks a boolean 'keep'")
    return value


class PrefilterStage(LLMStage):
    name = "prefilter"
    requires = ("record",)
    verdict_requests: int = 3

    def __init__(
        self, settings: LLMStageSettings, template: PromptTemplate, verdict_requests: int = 3
    ):
        self.template = template
        self.verdict_requests = verdict_requests
        self.setup(settings)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        traj = Trajectory.from_json(row["record"])
        prompt = self.template.render(traj)
        usage: Counter[str] = Counter()
        cost, attempts = 0.0, 0
        verdict: dict[str, Any] | None = None
        for n in range(self.verdict_requests):
            retry = {"verdict_retry": n} if n else {}  # the first id is the one it always was
            request = render(
                "prefilter", self.model, self.sampling, prompt.messages, seed=traj.id, **retry
            )
            completion = await self.call(row, request)
            if completion is not None:  # a completed request: its spend stays counted
                usage.update(json.loads(row["usage"]))
                cost += float(row["cost_usd"] or 0.0)
            attempts += int(row.get("attempts") or 0)
            row.update(usage=json.dumps(dict(usage)) if usage else None, cost_usd=cost)
            row["attempts"] = attempts
            if completion is None:
                return row
            try:
                verdict = parse_verdict(completion.text)
                break
            except RepairError as exc:
                if n + 1 >= self.verdict_requests:
                    return fail(row, self.name, exc.reason, f"{exc} (after {n + 1} requests)")
                add_retries(row, {exc.reason: 1})
        assert verdict is not None
        row["verdict"] = json.dumps(verdict, ensure_ascii=False)
        if not verdict["keep"]:
            reasons = "; ".join(str(r) for r in verdict.get("reasons") or [])[:300]
            return reject(row, self.name, "prefilter_rejected", reasons or "judge said no")
        return row


def build_prefilter(
    settings: LLMStageSettings, prompt: PromptFile, domain: Domain
) -> PrefilterStage:
    """Inside an actor: the judge (its template over the domain the driver loaded)."""
    template = PromptTemplate(prompt.path, domain, key_path=prompt.key)
    return PrefilterStage(settings, template, int(settings.extra.get("verdict_requests", 3)))
