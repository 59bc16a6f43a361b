"""Recipe configuration: one typed source of truth for every YAML recipe.

The pydantic models below generate the JSON Schema shipped in
``factory/schemas/recipe.schema.json`` (regenerate with
``python -m factory.schemas``; a test checks it is current).
Loading validates the raw YAML against that shipped schema first, so an
unknown key, a wrong type or a missing value is reported with its key path
(``llm.sampling.temperature: expected number, got 'hot'``) before any work,
then builds the typed model the rest of the code reads.

Relative paths inside a recipe are resolved against the recipe file's folder,
so ``pipelines/airline.yaml`` can say ``../seeds/airline/seeds.jsonl`` and
work from any working directory.

One module on purpose (about 730 lines): the recipe schema is documented once,
here, and read top to bottom like the recipe itself; every section model and
the loader that checks them against the generated schema belong together.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from factory import packs
from factory.core.trajectory import canonical_json
from factory.core.yamlfile import parse_yaml
from factory.errors import ConfigError, short

__all__ = [
    "SCHEMA_PATH",
    "AmplifyConfig",
    "CacheConfig",
    "DeadlineConfig",
    "DomainConfig",
    "EndpointConfig",
    "EnvSimConfig",
    "GroundingConfig",
    "HeldoutConfig",
    "LLMConfig",
    "MixtureConfig",
    "OutputConfig",
    "PartConfig",
    "PrefilterConfig",
    "PriceConfig",
    "RayConfig",
    "RecipeConfig",
    "RetryConfig",
    "SeedsConfig",
    "ServeConfig",
    "apply_overrides",
    "config_hash",
    "load_recipe",
    "resolve_recipe_path",
]

log = logging.getLogger(__name__)

SCHEMA_PATH = Path(__file__).parent / "schemas" / "recipe.schema.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class DomainConfig(_Strict):
    """The domain: its name and its pack (tools, policy, rules; a grammar for text actions)."""

    name: str = Field(description="Domain name, e.g. 'airline'.")
    tools: str | None = Field(
        None,
        description="JSON file: list of OpenAI function specs with x-kind; default: the pack "
        "of the domain's plug-in (then policy and rules default to the pack's too).",
    )
    policy: str | None = Field(None, description="Markdown policy shown to models and agents.")
    rules: str | None = Field(None, description="filters/<domain>.yaml with domain rules.")
    grammar: str | None = Field(
        None,
        description="Action grammar YAML of a text-action domain (the agent's action is text "
        "in its turn: AgentBench style); replaces tools. See docs/text-actions.md.",
    )
    compose: str | None = Field(
        None,
        description="Multi-app composition rules YAML (needs grammar): amplification shows "
        "one-app seeds of several apps and validates the composed trajectories.",
    )


class SeedsConfig(_Strict):
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


class EndpointConfig(_Strict):
    base_url: str = Field(description="OpenAI-compatible base URL ending in /v1.")
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding this endpoint's key. "
        "Keys are never written in recipes.",
    )
    weight: int = Field(1, ge=1, description="Relative capacity (e.g. GPUs behind it).")


class RetryConfig(_Strict):
    """Retries of a retryable failure (429, 408, 5xx, timeouts, connection errors), with backoff."""

    max_attempts: int = Field(6, ge=1, description="Attempts per request, first included.")
    base_delay_s: float = Field(1.0, gt=0, description="First backoff delay.")
    max_delay_s: float = Field(60.0, gt=0, description="Cap on one backoff delay.")


class DeadlineConfig(_Strict):
    """When an attempt counts as hung, and how long a whole request may take.

    An attempt's deadline is ``p99_factor`` x the 99th percentile of the latencies this
    actor observed (its last ``window`` successful attempts), clamped to
    ``[floor_s, llm.timeout_s]``. Until ``min_samples`` are observed (a cold start) it is
    2 x ``p99_factor`` x the slowest answer seen (clamped the same way) once 5 answers
    are in, and ``llm.timeout_s`` before. An attempt past its deadline is cancelled and
    retried like a timeout (it uses one of ``llm.retry.max_attempts``). So a hung request
    holds its slot for a few times the real tail instead of ``timeout_s`` per attempt.
    """

    adaptive: bool = Field(
        True, description="Cut attempts at p99_factor x the observed p99 (false: at timeout_s)."
    )
    p99_factor: float = Field(
        4.0,
        gt=1,
        description="Attempt deadline = this x observed p99 latency. With a lognormal tail "
        "of p99 = 10 x median, 4 cuts about 3 in 10,000 healthy answers.",
    )
    floor_s: float = Field(
        2.0,
        gt=0,
        description="Shortest adaptive attempt deadline (the ceiling is timeout_s). It binds "
        "only for answers whose p99 is under floor_s / p99_factor (a fast server, short "
        "answers): there a hung attempt is cut after floor_s, since every row after it "
        "waits for it to be used in call order.",
    )
    min_samples: int = Field(
        50, ge=1, description="Successful attempts observed before the adaptive deadline applies."
    )
    window: int = Field(
        2048, ge=1, description="Most recent attempt latencies the p99 is taken over."
    )
    hedge_share: float | None = Field(
        None,
        ge=0,
        le=0.5,
        description="Hedged requests: an attempt running past the observed p95 and twice "
        "the median while the actor uses at most half of its slots (the end of a run) is "
        "sent once more and the first answer wins (the other is cancelled; if both arrive, "
        "both are counted in the row's cost). At most this share of the attempts are "
        "hedges; 0 turns it off. Default: 0.02 when every endpoint is on this machine (a "
        "vLLM server stops a cancelled request: it costs nothing), else 0 (a provider may "
        "bill a cancelled request's tokens): set it for a vLLM pool on other nodes.",
    )
    request_s: float | None = Field(
        3600.0,
        gt=0,
        description="Bound on one request: attempts, backoff and waiting for an open "
        "circuit breaker. Past it the row is failed (attempts were sent) or unissued "
        "(none was: a resume sends it). null: no bound beyond the attempts.",
    )


class PriceConfig(_Strict):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens.")
    cached_input_per_mtok: float | None = Field(
        None, ge=0, description="USD per million cached prompt tokens (default: input price)."
    )
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens.")
    batch_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of these prices paid through a batch API (llm.backend: "
        "openai_batch; OpenAI's Batch tier: 0.5). Default: 0.5 for a model the built-in "
        "price table lists (factory.llm.pricing), else 1.",
    )


VLLM_COMMAND = [
    "vllm",
    "serve",
    "{model}",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--tensor-parallel-size",
    "{gpus}",
]


class ServeConfig(_Strict):
    """A pool of OpenAI-compatible servers the run starts on its Ray cluster and stops.

    One engine process per replica, each inside a Ray actor that holds the replica's
    GPUs through a placement group of its own (so a replacement lands on the same node
    and port, and the URL the LLM actors know stays valid). See factory.engine.serve.
    """

    replicas: int = Field(1, ge=1, description="Engine processes (one endpoint each).")
    gpus_per_replica: int = Field(
        1, ge=1, description="GPUs each replica holds (vLLM's tensor parallel size, {gpus})."
    )
    resource: str = Field(
        "GPU",
        min_length=1,
        description="Ray resource a replica reserves gpus_per_replica of: GPU (Ray then sets "
        "CUDA_VISIBLE_DEVICES), or a custom resource (a stand-in for GPUs in tests).",
    )
    cpus_per_replica: float = Field(
        1.0, ge=0, description="CPUs each replica reserves beside its GPUs."
    )
    command: list[str] = Field(
        default_factory=lambda: list(VLLM_COMMAND),
        min_length=1,
        description="The engine's command line; {model} (llm.model), {host}, {port}, {gpus} "
        "and {python} (the worker's interpreter) are filled in, engine_args appended.",
    )
    engine_args: list[str] = Field(
        default_factory=list,
        description="Extra engine arguments, e.g. [--enable-prefix-caching, --max-num-seqs, "
        "'256'].",
    )
    host: str = Field("0.0.0.0", description="Address the engine listens on ({host}).")
    port_range: tuple[int, int] = Field(
        (8000, 8099),
        description="First and last port replicas may use; replica i listens on first + i.",
    )
    startup_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Longest a replica may take to answer /health (model download and load).",
    )
    max_restarts: int = Field(
        10, ge=0, description="Replacements per replica after its engine or actor died."
    )


class LLMConfig(_Strict):
    """The model and how it is called: endpoints, backend, concurrency, retries, deadlines."""

    model: str = Field(description="Model id, e.g. gpt-5, o4-mini, or a vLLM served name.")
    endpoints: list[EndpointConfig] = Field(
        default_factory=lambda: [
            EndpointConfig(
                base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY", weight=1
            )
        ],
        min_length=1,
        description="One endpoint, or a pool of OpenAI-compatible servers.",
    )
    sampling: dict[str, Any] = Field(
        default_factory=dict,
        description="temperature, top_p, max_tokens / max_completion_tokens, "
        "reasoning_effort, seed.",
    )
    backend: str = Field(
        "aiohttp",
        description="How requests reach the model (factory.llm.backends): aiohttp (lean HTTP, "
        "~3x less CPU per call), openai (the openai SDK), openai_batch (the Batch API), "
        "ray_data (Ray Data LLM's HTTP or vLLM engine processor), or a plug-in's name.",
    )
    backend_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the chosen backend, checked by its config model.",
    )
    transport: Literal["aiohttp", "openai"] | None = Field(
        None, description="Deprecated: the old name of llm.backend (same values)."
    )
    concurrency: int = Field(64, ge=1, description="Requests in flight across all actors.")
    per_actor_concurrency: int = Field(32, ge=1, description="Requests in flight per actor.")
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest one attempt may take (the slowest legitimate answer); hung "
        "attempts are cut earlier by llm.deadline.",
    )
    stall_s: float | None = Field(
        300.0,
        gt=0,
        description="Stop the run (exit code 8) once no LLM call has succeeded for this long "
        "while calls were out: an endpoint that refuses connections or answers nothing. An "
        "endpoint silent for 20 s is named on the console before that. null: never stop.",
    )
    stop_grace_s: float = Field(
        5.0,
        ge=0,
        description="When a run stops at once (Ctrl-C, SIGTERM, a failed write), the requests "
        "already sent get this long to finish; their answers are stored, so the resume does "
        "not pay them again (a provider bills a cancelled request's tokens too). No new "
        "request starts meanwhile; a second Ctrl-C skips the wait. 0: cancel them at once.",
    )
    serve: ServeConfig | None = Field(
        None,
        description="Start a vLLM pool for llm.model on the Ray cluster for this run "
        "(replaces llm.endpoints).",
    )
    retry: RetryConfig = Field(default_factory=RetryConfig)  # type: ignore[arg-type]
    deadline: DeadlineConfig = Field(
        default_factory=DeadlineConfig,  # type: ignore[arg-type]
        description="Per-attempt deadlines from the observed latency, and a per-request bound.",
    )


class PrefilterConfig(_Strict):
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


class GroundingConfig(_Strict):
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


class AmplifyConfig(_Strict):
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


class OutputConfig(_Strict):
    """The output folder and the rows written to it."""

    dir: str = Field(
        "out",
        description="Output folder, relative to the working directory the run starts in "
        "(not to the recipe), or s3://BUCKET/PREFIX on any S3-compatible store "
        "(docs/cluster.md); overridden by --output.",
    )
    lease_ttl_s: float = Field(
        60.0,
        ge=1,
        description="s3:// output only: how long the output stays held after its run's last "
        "lease renewal (renewed every third of it): a run whose head died frees the output "
        "this long after.",
    )
    dataset_name: str = Field(description="Key of the dataset_info.json entry.")
    shard_rows: int = Field(5000, ge=1, description="Rows per Parquet shard at most.")
    reasoning: Literal["keep", "strip"] = Field(
        "keep", description="keep: <think>...</think> before calls and answers; strip: drop it."
    )
    tokenizer: str | None = Field(
        None,
        description="The model the data trains (a Hugging Face name or a local folder): "
        "OUT/llamafactory/sft.yaml trains it, and its tokenizer (loaded offline with "
        "transformers, when installed and cached) counts the rows' tokens for cutoff_len. "
        "Default: Qwen/Qwen3-8B, counted at 3 characters per token.",
    )
    template: str | None = Field(
        None,
        description="LLaMA-Factory chat template of sft.yaml (one that renders tools: qwen3, "
        "llama3, mistral, glm4 ...); default: told from output.tokenizer's name.",
    )


class RayConfig(_Strict):
    """Where the run's Ray session comes from and the resources its workers take."""

    address: str | None = Field(
        None,
        description="Ray cluster to join (`ray://head:10001`, `head:6379`, `auto`). Unset: "
        "join the cluster named by RAY_ADDRESS (set by `ray job submit`, and preferred over "
        "this field), else start a private local Ray; never the cluster a stale "
        "$RAY_TMPDIR/ray/ray_current_cluster file names.",
    )
    batch_size: int = Field(
        16,
        ge=1,
        description="No effect: the streaming engine sends each row to a worker as a slot "
        "frees (issue 22); accepted so that older recipes still load.",
    )
    actors: int = Field(2, ge=1, description="Actors per LLM stage.")
    num_cpus: float = Field(
        0.25, gt=0, le=8, description="CPUs per actor (fractional on small machines)."
    )
    placement: Literal["spread", "pack"] = Field(
        "spread",
        description="Where the workers go on a cluster: spread over the nodes (Ray's SPREAD "
        "strategy: a lost node takes as few workers as it can) or packed where Ray likes. "
        "A worker lost with its node is replaced wherever the cluster has room, now or when "
        "a node joins.",
    )


class HeldoutConfig(_Strict):
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


class EnvSimConfig(_Strict):
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


class MixtureConfig(_Strict):
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


class PartConfig(_Strict):
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


class NearDupConfig(_Strict):
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


class DecontamConfig(_Strict):
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


class CacheConfig(_Strict):
    """The response cache: every completed LLM answer, so none is paid for twice."""

    enabled: bool = Field(True, description="Reuse completed LLM responses (never pay twice).")
    path: str | None = Field(
        None,
        description="Cache location: a folder (relative to the working directory) or a pyarrow "
        "filesystem URI (s3://...) shared by all nodes; default OUTPUT/cache (on the store "
        "itself when the output is s3://).",
    )


class RecipeConfig(_Strict):
    name: str = Field(description="Recipe name, recorded in the manifest.")
    pipeline: Literal["curate", "amplify", "envsim"] = Field(
        description="curate: validate and convert seeds; amplify: LLM synthesis from seeds; "
        "envsim: simulator training data from the executable world."
    )
    domain: DomainConfig
    seeds: SeedsConfig | None = None
    envsim: EnvSimConfig | None = None
    mixture: MixtureConfig | None = None
    llm: LLMConfig | None = None
    prefilter: PrefilterConfig = Field(default_factory=PrefilterConfig)  # type: ignore[arg-type]
    amplify: AmplifyConfig | None = None
    parts: list[PartConfig] | None = Field(
        None,
        min_length=1,
        description="Mixed amplification: one part per domain, each amplified from its own "
        "seeds to its quota with this recipe's llm, prefilter and amplify settings, into one "
        "dataset whose rows carry their part's label (meta.domain). With parts, the recipe "
        "has no seeds section and domain.name names the mixture.",
    )
    output: OutputConfig
    ray: RayConfig = Field(default_factory=RayConfig)  # type: ignore[arg-type]
    cache: CacheConfig = Field(default_factory=CacheConfig)  # type: ignore[arg-type]
    near_duplicates: NearDupConfig | None = None
    decontamination: DecontamConfig | None = None
    prices: dict[str, PriceConfig] = Field(
        default_factory=dict, description="USD prices per model id, used for cost and planning."
    )

    # Filled by load_recipe, not part of the schema.
    _base_dir: Path = Path(".")
    _source: Path | None = None  # the recipe file

    @property
    def source(self) -> Path | None:
        """The recipe file this was loaded from (None for a recipe built in code)."""
        return self._source

    def resolve(self, path: str) -> Path:
        """A recipe path made absolute against the recipe's folder; ``factory:<folder>/...``
        names a file the factory ships (``factory:prompts/amplify.j2``, see ``factory.packs``)."""
        if packs.is_shipped(path):
            return packs.resolve(path)
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self._base_dir / p).resolve()


# --- loading ---------------------------------------------------------------------------


class _WithFactoryDefaults(GenerateJsonSchema):
    """Also states the defaults made by a ``default_factory`` (an empty list, the vLLM
    command line): an editor and the recipe reference then show them. A factory that
    makes a section (``RetryConfig``) states none: the section's keys carry their own."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        value = factory()  # type: ignore[call-arg]
        return NoDefault if isinstance(value, BaseModel) else value


def json_schema() -> dict[str, Any]:
    """The recipe JSON Schema, generated from the models above."""
    schema = RecipeConfig.model_json_schema(schema_generator=_WithFactoryDefaults)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "factory recipe"
    return schema


def _shipped_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def resolve_recipe_path(name: str | Path, cwd: Path | None = None) -> Path:
    """Find a recipe: the path as given, else ``pipelines/NAME`` (with or without .yaml)
    in the working directory, else the recipe of that name the factory ships.

    Why: ``ray job submit -- python -m factory.run airline.yaml`` is run from the
    repository root, where the file lives under ``pipelines/``; with the package
    installed (a cluster image, no ``--working-dir``) it runs from any folder.
    ``factory:pipelines/NAME.yaml`` names a shipped recipe explicitly.

    Raises:
        ConfigError: no such file; the message lists each place tried once and names
            the nearest recipe found there (``airlin.yaml``: did you mean airline.yaml?).
    """
    cwd = cwd or Path.cwd()
    folders: list[Path] = []
    if packs.is_shipped(str(name)):
        candidates = [packs.resolve(str(name))]
        folders.append(candidates[0].parent)
    else:
        given = Path(name)
        candidates = [given if given.is_absolute() else cwd / given]
        if not given.is_absolute() and len(given.parts) == 1:
            yaml_suffix = given.suffix in (".yaml", ".yml")
            stems = (given.name,) if yaml_suffix else (given.name, f"{given.name}.yaml")
            folders += [cwd / "pipelines", packs.folder("pipelines")]
            candidates += [folder / stem for folder in folders for stem in stems]
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    # The shipped folder is the working folder's pipelines/ in a checkout: name each once.
    tried = ", ".join(dict.fromkeys(str(c.resolve()) for c in candidates))
    raise ConfigError(
        f"recipe not found (tried {tried}){_nearest_recipe(Path(name).name, folders)}",
        key_path="recipe",
    )


def _nearest_recipe(name: str, folders: list[Path]) -> str:
    """``; did you mean airline.yaml?`` (the closest recipe file name in ``folders``), or
    the recipes there when none is close, or "" when the folders hold none."""
    known = sorted({p.stem for f in folders if f.is_dir() for p in f.glob("*.yaml")})
    if not known:
        return ""
    wanted = Path(name).stem if name.endswith((".yaml", ".yml")) else name
    close = difflib.get_close_matches(wanted, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}.yaml?"
    return f"; recipes there: {', '.join(f'{k}.yaml' for k in known)}"


def _key_path(parts: Any) -> str:
    """Dotted key path, one line; a key that is empty, holds a dot, blank or a control
    character is written as a JSON string (``prices."my model"``) so no step is lost."""
    return ".".join(_key_step(p) for p in parts)


def _key_step(part: Any) -> str:
    text = str(part)
    plain = text.isprintable() and not any(c.isspace() or c in '."' for c in text)
    return text if text and plain else json.dumps(text)


def _format_error(err: jsonschema.ValidationError) -> ConfigError:
    path = _key_path(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted((err.schema.get("properties") or {}).keys())
        # YAML keys may be null, numbers or dates: sort them as text, never by type.
        instance = err.instance if isinstance(err.instance, dict) else {}
        extra = sorted(_key_path([k]) for k in instance if k not in allowed)
        key = f"{path}.{extra[0]}" if path and extra else (extra[0] if extra else path)
        guess = difflib.get_close_matches(extra[0], allowed, n=1, cutoff=0.6) if extra else []
        if guess:
            meant = f"{path}.{guess[0]}" if path else guess[0]
            missing = guess[0] in (err.schema.get("required") or []) and guess[0] not in instance
            also = f" ({meant}: missing required value)" if missing else ""
            return ConfigError(f"unknown key; did you mean {meant}?{also}", key_path=key)
        return ConfigError(f"unknown key (allowed here: {', '.join(allowed)})", key_path=key)
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        key = f"{path}.{missing}" if path else missing
        return ConfigError("missing required value", key_path=key)
    if v == "type" or v == "anyOf":
        expected = err.schema.get("type") or [
            s.get("type") for s in err.schema.get("anyOf", []) if "type" in s
        ]
        return ConfigError(
            f"expected {expected}, got {type(err.instance).__name__} {err.instance!r}"[:300],
            key_path=path or "<root>",
        )
    if v == "enum" or v == "const":
        allowed = err.schema.get("enum") or [err.schema.get("const")]
        got = short(repr(err.instance), 100)
        return ConfigError(f"expected one of {allowed}, got {got}", key_path=path or "<root>")
    return ConfigError(err.message[:300], key_path=path or "<root>")


_RELEVANCE = jsonschema.exceptions.by_relevance()


def _relevance(error: jsonschema.ValidationError) -> tuple[Any, ...]:
    """jsonschema's ranking, with paths compared as text: YAML keys may be numbers or
    null, and ranking sibling errors compares their paths (TypeError for 0 < "a")."""
    deeper, path, *rest = _RELEVANCE(error)
    return (deeper, tuple(str(p) for p in path), *rest)


_JSON_LEAVES = (str, int, float, bool, type(None))


def _check_json_data(raw: dict[str, Any]) -> None:
    """Refuse what YAML has and JSON has not: a key that is not text (``null:``, ``1:``)
    or a value that is bytes (``!!binary``), a date or a set.

    JSON Schema only knows JSON: jsonschema drops a null key from an error's path
    (naming the wrong field), and free-form sections (``llm.sampling``) would pass
    bytes or a date on to the config hash and the request body, which cannot
    encode them.
    """
    todo: list[tuple[list[Any], Any]] = [([], raw)]
    while todo:
        path, node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = [*path, key]
            if isinstance(node, dict) and not isinstance(key, str):
                got = f"{type(key).__name__} {short(repr(key), 40)}"
                raise ConfigError(f"keys must be text, got {got}", key_path=_key_path(where))
            if isinstance(value, (dict, list)):
                todo.append((where, value))
            elif not isinstance(value, _JSON_LEAVES):
                got = f"{type(value).__name__} {short(repr(value), 40)}"
                raise ConfigError(f"not a JSON value: {got}", key_path=_key_path(where))


def validate_raw(raw: Any) -> None:
    """Validate a raw recipe mapping against the shipped JSON Schema.

    Raises:
        ConfigError: naming the first offending key path (the deepest, most specific error).
    """
    if not isinstance(raw, dict):
        raise ConfigError("a recipe must be a YAML mapping", key_path="<root>")
    _check_json_data(raw)
    validator = jsonschema.Draft202012Validator(_shipped_schema())
    errors = list(validator.iter_errors(raw))
    if errors:
        best = jsonschema.exceptions.best_match(errors, key=_relevance)
        # Descend into anyOf branches (optional sections) for the most precise message.
        while best.context:
            best = jsonschema.exceptions.best_match(_meant_branch(best), key=_relevance)
        raise _format_error(_unknown_key_first(best, errors))


def _meant_branch(err: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors of the ``anyOf`` branches meant for the value: a branch that refused
    the value's type (``null`` for a mapping) explains nothing about a misspelt key."""
    context = list(err.context or [])
    refused = {
        e.relative_schema_path[0]
        for e in context
        if e.validator == "type" and not e.relative_path and e.relative_schema_path
    }
    meant = [
        e for e in context if e.relative_schema_path and e.relative_schema_path[0] not in refused
    ]
    return meant or context


def _unknown_key_first(
    best: jsonschema.ValidationError, errors: list[jsonschema.ValidationError]
) -> jsonschema.ValidationError:
    """A missing required key beside an unknown one is most likely that key misspelt:
    report the unknown key, whose message names the required one."""
    if best.validator != "required":
        return best
    siblings = [best.parent.context or []] if best.parent is not None else [errors]
    for e in siblings[0]:
        if e.validator == "additionalProperties" and list(e.absolute_path) == list(
            best.absolute_path
        ):
            return e
    return best


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        message = f"--set expects key.path=value, got {short(item, 80)!r}"
        raise ConfigError(message, key_path="--set")
    key, _, value = item.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set has an empty key in {short(item, 80)!r}", key_path="--set")
    parsed = parse_yaml(value, "value", key_path=_key_path(parts)) if value.strip() else ""
    return parts, parsed


def _is_index(part: str) -> bool:
    # str.isdigit() is true for "²", which int() refuses: ASCII digits only.
    return part.isascii() and part.isdigit()


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set key.path=value`` items (values parsed as YAML) to a raw recipe.

    List items are addressed by index (``llm.endpoints.0.base_url``). Intermediate
    mappings are created as needed; whether the key is allowed is the schema's call.
    """
    for item in overrides:
        parts, value = _parse_override(item)
        node: Any = raw
        for i, part in enumerate(parts[:-1]):
            where = _key_path(parts[: i + 1])
            if isinstance(node, list):
                if not _is_index(part) or int(part) >= len(node):
                    raise ConfigError("no such list index", key_path=where)
                node = node[int(part)]
            elif isinstance(node, dict):
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
            else:
                raise ConfigError("cannot set a key inside a scalar", key_path=where)
        last = parts[-1]
        if isinstance(node, list):
            if not _is_index(last) or int(last) >= len(node):
                raise ConfigError("no such list index", key_path=_key_path(parts))
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError("cannot set a key inside a scalar", key_path=_key_path(parts))
    return raw


def _check_domain(domain: DomainConfig, at: str) -> None:
    """A text-action domain (``grammar``) names no tools; ``compose`` needs a grammar."""
    if domain.grammar is not None and domain.tools is not None:
        raise ConfigError(
            "a text-action domain declares its actions in domain.grammar; remove domain.tools",
            key_path=f"{at}.tools",
        )
    if domain.compose is not None and domain.grammar is None:
        raise ConfigError(
            "composition rules compose text actions: set domain.grammar too",
            key_path=f"{at}.compose",
        )


def _semantic_checks(cfg: RecipeConfig) -> None:
    _check_domain(cfg.domain, "domain")
    for i, part in enumerate(cfg.parts or []):
        _check_domain(part.domain, f"parts.{i}.domain")
    if cfg.domain.grammar is not None and cfg.pipeline == "envsim":
        raise ConfigError(
            "the envsim pipeline needs an executable world; a text-action domain has none",
            key_path="domain.grammar",
        )
    if cfg.domain.grammar is not None and cfg.amplify is not None:
        if cfg.amplify.grounding is not None:
            raise ConfigError(
                "grounding replays tool calls on an executable world; a text-action domain "
                "has none",
                key_path="amplify.grounding",
            )
        if cfg.amplify.system_prompt_format != "json":
            raise ConfigError(
                "a text-action domain has no tools to list in the system prompt",
                key_path="amplify.system_prompt_format",
            )
    if cfg.pipeline == "envsim":
        if cfg.envsim is None:
            raise ConfigError("the envsim pipeline needs an envsim section", key_path="envsim")
        if cfg.mixture is None:
            raise ConfigError("the envsim pipeline needs a mixture section", key_path="mixture")
        return
    if cfg.parts is not None:
        _check_parts(cfg)
    elif cfg.seeds is None:
        raise ConfigError("missing required value", key_path="seeds")
    elif cfg.seeds.path is None and cfg.seeds.hf_dataset is None:
        raise ConfigError("set seeds.path or seeds.hf_dataset", key_path="seeds")
    if cfg.pipeline == "amplify":
        if cfg.llm is None:
            raise ConfigError("the amplify pipeline needs an llm section", key_path="llm")
        if cfg.amplify is None:
            raise ConfigError("the amplify pipeline needs an amplify section", key_path="amplify")
    if cfg.llm is not None and cfg.llm.transport is not None:
        _migrate_transport(cfg.llm)
    if cfg.llm is not None and cfg.llm.per_actor_concurrency > cfg.llm.concurrency:
        raise ConfigError(
            f"per-actor limit {cfg.llm.per_actor_concurrency} exceeds the global "
            f"limit {cfg.llm.concurrency}",
            key_path="llm.per_actor_concurrency",
        )


def _check_parts(cfg: RecipeConfig) -> None:
    """A mixed recipe: an amplify recipe whose seeds, domains and quotas are its parts."""
    if cfg.pipeline != "amplify":
        raise ConfigError("parts need the amplify pipeline", key_path="parts")
    if cfg.seeds is not None:
        raise ConfigError("a recipe with parts names its seeds in each part", key_path="seeds")
    if cfg.mixture is not None:
        raise ConfigError("a recipe with parts selects by its quotas", key_path="mixture")
    assert cfg.parts is not None
    labels = [p.label or p.domain.name for p in cfg.parts]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ConfigError(f"label {label!r} is used twice", key_path=f"parts.{i}")
    for i, part in enumerate(cfg.parts):
        if part.seeds.path is None and part.seeds.hf_dataset is None:
            raise ConfigError("set seeds.path or seeds.hf_dataset", key_path=f"parts.{i}.seeds")
    total = sum(p.quota for p in cfg.parts)
    if cfg.amplify is not None and cfg.amplify.target != total:
        raise ConfigError(
            f"amplify.target ({cfg.amplify.target}) must equal the sum of the parts' quotas "
            f"({total})",
            key_path="amplify.target",
        )


def _migrate_transport(llm: LLMConfig) -> None:
    """``llm.transport`` (before issue 9) still chooses the backend, with a warning."""
    if "backend" in llm.model_fields_set and llm.backend != llm.transport:
        raise ConfigError(
            f"llm.transport ({llm.transport}) contradicts llm.backend ({llm.backend}); "
            "llm.transport is deprecated: delete it and keep llm.backend",
            key_path="llm.transport",
        )
    assert llm.transport is not None
    log.warning(
        "llm.transport is deprecated; write `backend: %s` in the recipe's llm section instead",
        llm.transport,
    )
    llm.backend = llm.transport


def _input_path(raw: Any, loc: tuple[Any, ...], *, missing: bool) -> str:
    """The key path of a pydantic error location in the raw recipe.

    Pydantic's locations name union branches (``list[str]``) and dict keys
    (``[key]``) that are no keys of the input; only steps found in ``raw`` are
    kept, plus the last one of a missing value.
    """
    parts: list[Any] = []
    node = raw
    for step in loc:
        if isinstance(node, dict):
            found = step in node
            # The input's own key: pydantic reports a YAML key `false` as 0 (False == 0).
            step = next((k for k in node if k == step), step)
        else:
            found = isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)
        if found:
            node = node[step]
            parts.append(step)
    if missing and loc:
        parts.append(loc[-1])
    return _key_path(parts) or "<root>"


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> RecipeConfig:
    """Read, override, validate and type a recipe.

    Raises:
        ConfigError: unreadable YAML, schema violation (with key path) or an
            inconsistent combination of sections.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc.strerror}", key_path="recipe") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"recipe {path} is not UTF-8 text: {exc}", key_path="recipe") from exc
    raw = parse_yaml(text, f"recipe {path}", key_path="recipe")
    if raw is None:
        raw = {}
    if isinstance(raw, dict):
        raw = apply_overrides(raw, overrides or [])
    validate_raw(raw)
    try:
        cfg = RecipeConfig.model_validate(raw)
    except PydanticValidationError as exc:  # the schema should have caught it; keep the path
        first = exc.errors()[0]
        key = _input_path(raw, first["loc"], missing=first["type"] == "missing")
        raise ConfigError(first["msg"], key_path=key) from exc
    cfg._base_dir = path.resolve().parent
    cfg._source = path.resolve()
    _semantic_checks(cfg)
    return cfg


def config_hash(cfg: RecipeConfig) -> str:
    """Hash of everything that changes the output (all recipe values, not the output dir)."""
    data = cfg.model_dump(mode="json")
    data.get("output", {}).pop("dir", None)
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]
