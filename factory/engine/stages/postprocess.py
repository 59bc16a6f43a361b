"""Completion -> accepted training row, or a reject that keeps the raw completion.

Order: parse (with lossless JSON repair) -> deployment system prompt and the
domain's tools -> grounding, when the recipe has it (replay every call on the
executable world; verify rejects a contradiction, ground replaces simulated
observations) -> validation (tool schemas, so hallucinated tools are rejected;
domain rules; LLaMA-Factory structure) -> trajectory labels -> export. Like
Simia's last step, the system prompt the model saw while generating is replaced
by the one the agent will be deployed with: the pack's policy, or, for a pack without
one, the system prompt of the row's own seed (never an empty or a stub one).

Labels: with grounding, ``delta_size`` is the exact |Δ| from the executor;
without, ``write_calls`` counts successful write calls (a different name, so a
proxy is never mistaken for an exact label).

A text-action domain (an action grammar) reads the completion with its grammar,
validates its actions (and, with composition rules, the composition) instead of tool
schemas, labels it with ``action_labels`` and writes the agent's turns as they are,
the grammar in the system prompt and no tools column.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from factory.core.decontam import DECONTAM_STAGE
from factory.core.formats.completion import parse_output
from factory.core.formats.textaction import parse_completion
from factory.core.labels import action_labels, trajectory_labels
from factory.core.neardup import signature_bytes
from factory.core.trajectory import Trajectory
from factory.core.validate import validate_rendered
from factory.engine.quality import build_decontaminator, neardup_params
from factory.engine.settings import PostprocessSettings
from factory.engine.stages.amplify import grounding_world
from factory.engine.stages.base import Stage, reject
from factory.engine.stages.export import output_fields, sharegpt_row
from factory.envs.pack import Domain
from factory.envsim.grounding import apply_mode, replay
from factory.errors import RepairError

__all__ = ["PostprocessStage", "deployment_system_prompt", "seed_systems"]

_HERMES_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_HERMES_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def deployment_system_prompt(
    domain: Domain, fmt: str, policy: str | None = None
) -> tuple[str, bool]:
    """(system prompt, tools-in-column) for the output rows.

    ``json``: the policy only; tools go in the ``tools`` column and LLaMA-Factory's
    template renders them. ``hermes``: the policy plus a Hermes ``<tools>`` block,
    and no ``tools`` column (it would be rendered twice). A text-action domain: the
    policy plus its actions (``ActionGrammar.describe``), and no ``tools`` column.
    ``policy`` replaces the domain's (a seed's own system prompt).
    """
    policy = (domain.policy if policy is None else policy).strip()
    if domain.grammar is not None:
        return f"{policy}\n\n# Actions\n\n{domain.grammar.describe()}".lstrip(), False
    if fmt == "hermes":
        lines = "\n".join(
            json.dumps({"type": "function", "function": t}, ensure_ascii=False)
            for t in domain.public_tools()
        )
        return f"{policy}\n\n{_HERMES_HEADER}{lines}{_HERMES_FOOTER}", False
    return policy, True


class PostprocessStage(Stage):
    name = "postprocess"
    requires = ("completion",)  # produces: id, output (accepted) or reason + raw (rejected)

    def __init__(
        self,
        settings: PostprocessSettings,
        domain: Domain,
        systems: Mapping[str, str] | None = None,
    ):
        self.domain = domain
        self.format = settings.system_prompt_format
        # A pack without a policy: each row keeps the system prompt of its own seed.
        self.seed_systems = dict(systems or {})
        self.reasoning = settings.reasoning
        grounding = settings.grounding
        self.mode = grounding.mode if grounding else None
        self.world = grounding_world(grounding, domain.name) if grounding else None
        self.scenario_seed = settings.seed
        self.system, self.tools_in_column = deployment_system_prompt(self.domain, self.format)
        self.decontam = build_decontaminator(settings.quality)
        self.neardup = neardup_params(settings.quality.near_duplicates)

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        grammar = self.domain.grammar
        try:
            if grammar is not None:
                traj = parse_completion(row["completion"], grammar)
            else:
                traj = parse_output(row["completion"])
        except RepairError as exc:
            return reject(row, self.name, exc.reason, str(exc), raw=row["completion"])
        traj.system = self.system
        if self.seed_systems.get(row.get("seed_id") or ""):
            own = self.seed_systems[row["seed_id"]]
            traj.system = deployment_system_prompt(self.domain, self.format, own)[0]
        traj.tools = self.domain.tools
        traj.metadata.update(
            source=row.get("source"),
            seed_id=row.get("seed_id"),
            generator=row.get("fingerprint"),
        )
        delta_size = None
        if self.world is not None and self.mode is not None:
            scenario = self.world.scenario(int(row["call_index"]), self.scenario_seed)
            result = replay(traj, self.world.fresh_env())
            grounded, info = apply_mode(traj, result, self.mode)
            summary = {k: v for k, v in info.items() if k not in ("message", "reason")}
            row["grounding"] = json.dumps(summary)  # counted for rejected rows too
            if grounded is None:
                return reject(
                    row, self.name, info["reason"], info["message"], raw=row["completion"]
                )
            traj = grounded
            traj.metadata["grounding"] = {**summary, "user_id": self.world.subject(scenario)}
            delta_size = info["delta_size"]
        issues, rendered = validate_rendered(
            traj,
            rules=self.domain.rules,
            reasoning=self.reasoning,
            grammar=grammar,
            compose=self.domain.compose,
        )
        if issues:
            detail = "; ".join(str(i) for i in issues[:3])
            return reject(row, self.name, issues[0].code, detail, raw=row["completion"])
        if grammar is not None:
            labels = action_labels(traj, grammar)
        else:
            labels = trajectory_labels(
                traj, write_tools=self.domain.write_tools(), delta_size=delta_size
            )
        traj.metadata["labels"] = labels
        row["labels"] = json.dumps(labels)
        if self.decontam is not None:
            issue = self.decontam.check(traj, row.get("seed_id"))
            if issue is not None:
                return reject(row, DECONTAM_STAGE, issue.code, issue.message, raw=row["completion"])
        if self.neardup is not None:  # the driver's index compares signatures, never rows
            row["minhash"] = signature_bytes(traj, self.neardup)
        traj.metadata["id"] = traj.content_id()
        out = sharegpt_row(traj, self.reasoning, rendered)  # rendered once, by validation
        if not self.tools_in_column:
            out["tools"] = ""
        # Accepted rows carry only the training row to the driver: the record and the raw
        # completion would double what crosses the object store for nothing.
        row.update(id=traj.id, record=None, completion=None, **output_fields(out))
        return row


def seed_systems(domain: Domain, seeds: Mapping[str, str]) -> dict[str, str]:
    """On the driver: the system prompt of each kept seed (seed id -> record JSON) when the
    pack has no policy (each row then keeps its own seed's), else nothing.

    Why on the driver: the stage needs these prompts, not the records; sending only them
    keeps the post-processing spec at the size of the domain (airline: 20 kB, not the
    937 kB of the kept seeds that the amplification spec carries anyway)."""
    if domain.policy.strip():
        return {}
    return {sid: Trajectory.from_json(rec).system for sid, rec in seeds.items()}


def build_postprocess(
    settings: PostprocessSettings, domain: Domain, systems: Mapping[str, str] | None = None
) -> PostprocessStage:
    """Inside an actor: the stage over the domain the driver loaded; ``systems`` (seed id
    -> system prompt, ``seed_systems``) give a pack without a policy the seeds' own."""
    return PostprocessStage(settings, domain, systems)
