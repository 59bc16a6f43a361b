"""The sections that say what a job does: its seeds, the judge, amplification and its
grounding, the envsim job and its held-out split, a mixture's quotas, a mixed recipe's
parts, near-duplicate removal and decontamination.

Why one module: each is small, and a recipe type (``factory.recipe.types``) is the
set of these sections its job needs, so they are read side by side.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from factory.recipe.domain import DomainConfig
from factory.recipe.section import Section

__all__ = [
    "AmplifyConfig",
    "DecontamConfig",
    "EnvSimConfig",
    "GroundingConfig",
    "HeldoutConfig",
    "MixtureConfig",
    "NearDupConfig",
    "PartConfig",
    "PrefilterConfig",
    "SeedsConfig",
]


class SeedsConfig(Section):
    """Where the seed trajectories are read from (curate and amplify recipes)."""

    path: str | list[str] | None = Field(
        None,
        description="File, folder or glob (or a list of them) of seed trajectories; a "
        "pyarrow filesystem URI (s3://bucket/seeds/, a glob under it) is read streamed.",
    )
    hf_dataset: str | None = Field(
        None, description="Hugging Face dataset id or local dataset folder (instead of path)."
    )
    hf_split: str = Field("train", description="Split of hf_dataset.")
    tools_from_domain: bool = Field(
        True, description="Give seeds without a tools field the domain's tool list."
    )
    min_reward: float | None = Field(
        None, description="Reject seeds whose recorded reward is below this (tau-bench)."
    )
    limit: int | None = Field(None, ge=1, description="Read at most this many seed records.")


class PrefilterConfig(Section):
    """The LLM judge that decides which valid seeds are amplified."""

    enabled: bool = Field(True, description="Ask an LLM judge whether each valid seed is kept.")
    model: str | None = Field(None, description="Judge model (default: llm.model).")
    prompt: str = Field("../prompts/prefilter.j2", description="Judge prompt template.")
    completion_tokens_estimate: int = Field(
        80, ge=1, description="Planning estimate of a verdict's length in tokens."
    )
    verdict_requests: int = Field(
        3,
        ge=1,
        description="Requests per seed at most when the judge's answer holds no usable "
        "verdict: each retry is a new request (its own id and cache entry), counted in "
        "retries.unparsable_completion; the seed fails only after the last.",
    )


class GroundingConfig(Section):
    """Ground amplified trajectories in an executable world (the domain must have one)."""

    mode: Literal["verify", "ground", "off"] = Field(
        "verify",
        description="verify: reject a trajectory an executed observation contradicts; "
        "ground: replace simulated observations with executed ones; off: measure only.",
    )
    world_seed: int = Field(0, description="Seed of the generated world the prompts show.")
    world_sizes: dict[str, int] = Field(
        default_factory=dict, description="n_users, n_flights, n_reservations of the world."
    )
    prompt: str = Field(
        "../prompts/amplify_grounded.j2", description="Amplification template with a state block."
    )


class AmplifyConfig(Section):
    """The amplification job: target, prompts, grounding, budget caps."""

    target: int = Field(ge=1, description="Accepted trajectories to produce.")
    seed: int = Field(0, description="Seed for deterministic seed assignment and sampling.")
    prompt: str = Field("../prompts/amplify.j2", description="Amplification prompt template.")
    expected_yield: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The recipe's yield, accepted rows / calls: the plan's calls are the target "
        "over it, and the run's planner starts from it until its calls come back. Once a run "
        "of the output folder has ended, the plan weighs in the yield that run measured (and "
        "says so).",
    )
    max_calls: int | None = Field(None, ge=1, description="Stop issuing calls after this many.")
    max_cost_usd: float | None = Field(None, gt=0, description="Stop issuing at this spend.")
    max_tokens: int | None = Field(None, ge=1, description="Stop issuing at this many tokens.")
    confirm_above_usd: float | None = Field(
        25.0,
        ge=0,
        description="On a terminal, a run whose estimated cost (what is left to pay) exceeds "
        "this asks for confirmation before its first call, unless --yes (overridden by "
        "--confirm-above). Without a terminal (ray job submit) nothing is asked: the plan is "
        "printed and the caps bound the spend. null: never ask.",
    )
    system_prompt_format: Literal["json", "hermes"] = Field(
        "json", description="Tools block format of the deployment system prompt in the output."
    )
    grounding: GroundingConfig | None = Field(
        None, description="Show each call a slice of an executable world and replay its calls."
    )


class HeldoutConfig(Section):
    """A held-out split of the envsim job, never overlapping the training selection."""

    by: Literal["env", "task", "user"] = Field(
        description="env: sampled on a world of its own (heldout.world_seed); task / user: a "
        "seeded share of the task or user ids is kept out of the training selection."
    )
    share: float = Field(0.1, gt=0, lt=1, description="by task / user: share of the ids held out.")
    scale: float = Field(
        0.1, gt=0, le=1, description="Held-out rows per quota: ceil(quota count x scale)."
    )
    world_seed: int | None = Field(
        None, description="by env: seed of the held-out world (default envsim.world_seed + 1)."
    )
    seed: int = Field(0, description="Seed of the id split and of the held-out selection.")


class EnvSimConfig(Section):
    """Simulator training data from an executable world (EnvSimBench)."""

    world_seed: int = Field(0, description="Seed of the generated world.")
    world_sizes: dict[str, int] = Field(
        default_factory=dict, description="n_users, n_flights, n_reservations of the world."
    )
    seed: int = Field(0, description="Seed of the episode sampler.")
    episodes_per_round: int = Field(
        2000,
        ge=1,
        description="No effect: the streaming engine checks the quotas as each episode comes "
        "back (issue 22); accepted so that older recipes still load.",
    )
    max_episodes: int = Field(
        60000, ge=1, description="Stop sampling here; unmet quotas are reported as shortfall."
    )
    invalid_share: float = Field(
        0.2, ge=0, le=1, description="Share of calls made wrong on purpose (Error observations)."
    )
    violation_share: float = Field(
        0.05, ge=0, le=1, description="Share of policy-violating calls that still succeed."
    )
    with_code: bool = Field(False, description="Show the tool's source code in the instruction.")
    layout: Literal["factory", "envsimbench"] = Field(
        "factory",
        description="Alpaca layout of the rows: factory (prompts/simulate.j2) or envsimbench "
        "(EnvSimBench's SFT rows: environment code in the instruction, input "
        "{initial_config, tool_call}, output {feedback, config_changes} with dotted paths).",
    )
    validate_arguments: bool = Field(
        True,
        description="The executor refuses a call whose arguments do not fit the tool's JSON "
        "Schema (Error: invalid argument ...); false runs it as tau-bench does.",
    )
    heldout: HeldoutConfig | None = Field(
        None, description="Write a held-out split to OUTPUT/heldout/ (by env, task or user)."
    )


class MixtureConfig(Section):
    """A mixture file's quotas, applied when the rows are selected."""

    path: str = Field(description="Mixture YAML (quotas per group), relative to the recipe.")
    seed: int = Field(0, description="Seed of the selection order.")
    exclude_task_ids: list[str | int] = Field(
        default_factory=list, description="Decontamination: never select these task ids."
    )
    exclude_user_ids: list[str] = Field(
        default_factory=list, description="Decontamination: never select these user ids."
    )
    allow_shortfall: bool = Field(
        True, description="false: an unmet quota fails the run (exit 3) instead of a report."
    )


class PartConfig(Section):
    """One domain of a mixed amplification recipe: its pack, its seeds and its quota."""

    domain: DomainConfig = Field(description="The part's domain (pack files or plug-in name).")
    seeds: SeedsConfig = Field(description="The part's seed trajectories.")
    quota: int = Field(ge=1, description="Accepted rows of this part in the mixed dataset.")
    label: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="Label written on every row of the part (meta.domain) and the name of "
        "its folder under parts/; default: the part's domain name.",
    )


class NearDupConfig(Section):
    """Near-duplicate removal (``factory.core.neardup``); off unless the recipe has it."""

    view: Literal["user", "tools", "both"] = Field(
        "user",
        description="What is compared: the user turns, the tool names with their argument "
        "values in order, or both.",
    )
    threshold: float = Field(
        0.35,
        gt=0,
        le=1,
        description="Estimated Jaccard similarity of the view's word n-grams at which a row "
        "is a near-duplicate of an earlier one (renamed copies of a trajectory measure >= "
        "0.45 over user 2-grams, distinct airline seeds <= 0.18).",
    )
    ngram: int = Field(2, ge=1, le=16, description="Words per shingle.")
    num_perm: int = Field(128, ge=16, le=1024, description="MinHash permutations.")
    seed: int = Field(0, description="MinHash seed (an index only compares with the same).")
    index: list[str] = Field(
        default_factory=list,
        description="neardup.index files of earlier runs: their rows count as already kept, "
        "so this run does not re-add them.",
    )


class DecontamConfig(Section):
    """Benchmark decontamination (``factory.core.decontam``)."""

    benchmark: list[str] = Field(
        default_factory=list,
        description="Files of benchmark texts (.txt lines, .json/.jsonl strings or objects "
        "with an 'instruction'), e.g. tau-bench's test task instructions.",
    )
    n: int = Field(8, ge=1, le=50, description="Words per n-gram.")
    threshold: float = Field(
        0.5, gt=0, le=1, description="Share of one benchmark text's n-grams that contaminates."
    )
    exclude_task_ids: list[str | int] = Field(
        default_factory=list,
        description="Task or seed ids that contaminate whatever the text (mixture's too).",
    )
