"""Amplification: one LLM call writes one whole new trajectory from a reference.

Seeds are assigned to calls without replacement: the kept seeds are put in a
fixed order (sorted by id, then shuffled with ``amplify.seed``) and call ``k``
uses seed ``order[k % n]`` as variation ``k // n``. Every seed is used once
before any is used twice, the assignment is a pure function of ``k`` (so a
rerun or a resume makes the same requests) and no list of work items exists
anywhere: the driver only says which range of ``k`` to issue.
"""

from __future__ import annotations

import random
from typing import Any

from factory.config import RecipeConfig
from factory.domain import load_domain
from factory.prompts import PromptTemplate
from factory.stages.llm_stage import LLMStage, build_client, request_id
from factory.trajectory import Trajectory

__all__ = ["AmplifyStage", "assign", "seed_order"]


def seed_order(seed_ids: list[str], seed: int) -> list[str]:
    """The deterministic order in which seeds are used."""
    order = sorted(set(seed_ids))
    random.Random(seed).shuffle(order)
    return order


def assign(call_index: int, order: list[str]) -> tuple[str, int]:
    """(seed id, variation number) of call ``call_index``: round-robin, no replacement."""
    return order[call_index % len(order)], call_index // len(order)


class AmplifyStage(LLMStage):
    name = "amplify"
    requires = ("call_index",)

    def __init__(self, cfg: RecipeConfig, seeds: dict[str, str], start: int = 0):
        assert cfg.llm is not None and cfg.amplify is not None
        self.model = cfg.llm.model
        self.sampling = dict(cfg.llm.sampling)
        self.template = PromptTemplate(
            cfg.resolve(cfg.amplify.prompt), load_domain(cfg), key_path="amplify.prompt"
        )
        self.seeds = {sid: Trajectory.from_json(rec) for sid, rec in seeds.items()}
        self.order = seed_order(list(seeds), cfg.amplify.seed)
        self.client = build_client(cfg, self.model)
        self.start = start

    def check_columns(self, row: dict[str, Any]) -> None:
        # Work items come straight from ``ray.data.range``: the round's row number
        # arrives in ``id`` and becomes the global call index here (no extra operator).
        if row.get("call_index") is None and isinstance(row.get("id"), int):
            row["call_index"], row["id"] = self.start + row["id"], None
        super().check_columns(row)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        seed_id, variation = assign(int(row["call_index"]), self.order)
        row.update(seed_id=seed_id, source=f"{seed_id}#{variation}")
        prompt = self.template.render(self.seeds[seed_id], variation=variation)
        rid = request_id(
            "amplify", self.model, self.sampling, prompt.messages, seed=seed_id, variation=variation
        )
        await self.call(row, prompt.messages, rid)
        return row


def build_amplify(cfg: RecipeConfig, seeds: dict[str, str], start: int = 0) -> AmplifyStage:
    return AmplifyStage(cfg, seeds, start)
