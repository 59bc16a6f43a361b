"""LLM pre-filter: a judge decides which valid seeds are worth amplifying.

Runs only on seeds that passed every rule (``SeedCheckStage``), so the LLM is
never paid to look at a seed the rules already refuse. The verdict is kept on
the row, accepted or not, so a rejected seed says why.
"""

from __future__ import annotations

import json
from typing import Any

from factory.config import RecipeConfig
from factory.domain import load_domain
from factory.errors import RepairError
from factory.prompts import PromptTemplate
from factory.repair import parse_json_value
from factory.stages.base import fail, reject
from factory.stages.llm_stage import LLMStage, build_client, request_id
from factory.trajectory import Trajectory

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

    def __init__(self, cfg: RecipeConfig):
        assert cfg.llm is not None
        self.model = cfg.prefilter.model or cfg.llm.model
        self.sampling = dict(cfg.llm.sampling)
        self.template = PromptTemplate(
            cfg.resolve(cfg.prefilter.prompt), load_domain(cfg), key_path="prefilter.prompt"
        )
        self.client = build_client(cfg, self.model)
        self.attach(cfg)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        traj = Trajectory.from_json(row["record"])
        prompt = self.template.render(traj)
        rid = request_id("prefilter", self.model, self.sampling, prompt.messages, seed=traj.id)
        completion = await self.call(row, prompt.messages, rid)
        if completion is None:
            return row
        try:
            verdict = parse_verdict(completion.text)
        except RepairError as exc:
            return fail(row, self.name, exc.reason, str(exc))
        row["verdict"] = json.dumps(verdict, ensure_ascii=False)
        if not verdict["keep"]:
            reasons = "; ".join(str(r) for r in verdict.get("reasons") or [])[:300]
            return reject(row, self.name, "prefilter_rejected", reasons or "judge said no")
        return row


def build_prefilter(cfg: RecipeConfig) -> PrefilterStage:
    return PrefilterStage(cfg)
