"""The recipe's ``llm`` section and the sections it holds (endpoints, retries,
deadlines, a served vLLM pool) and ``prices``: how the model is called and billed.

Why together: these are what an LLM stage's typed settings
(``factory.engine.settings.LLMStageSettings``) carry to the actors; nothing else in
the recipe reaches the LLM layer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from factory.recipe.section import Section

__all__ = [
    "VLLM_COMMAND",
    "DeadlineConfig",
    "EndpointConfig",
    "LLMConfig",
    "PriceConfig",
    "RetryConfig",
    "ServeConfig",
]


class EndpointConfig(Section):
    base_url: str = Field(
        description="Base URL with the API's version path, e.g. https://api.openai.com/v1 "
        "(an OpenAI-compatible server), https://api.anthropic.com/v1, "
        "https://generativelanguage.googleapis.com/v1beta."
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding this endpoint's key. "
        "Keys are never written in recipes.",
    )
    weight: int = Field(1, ge=1, description="Relative capacity (e.g. GPUs behind it).")


class RetryConfig(Section):
    """Retries of a retryable failure (429, 408, 5xx, timeouts, connection errors), with backoff."""

    max_attempts: int = Field(6, ge=1, description="Attempts per request, first included.")
    base_delay_s: float = Field(1.0, gt=0, description="First backoff delay.")
    max_delay_s: float = Field(60.0, gt=0, description="Cap on one backoff delay.")


class DeadlineConfig(Section):
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


class PriceConfig(Section):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens.")
    cached_input_per_mtok: float | None = Field(
        None, ge=0, description="USD per million cached prompt tokens (default: input price)."
    )
    cache_write_per_mtok: float | None = Field(
        None,
        ge=0,
        description="USD per million prompt tokens written to a provider's prompt cache "
        "(default: input price; OpenAI-compatible servers report no cache writes).",
    )
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens.")
    cache_storage_per_mtok_hour: float | None = Field(
        None,
        ge=0,
        description="USD per million tokens per hour an explicit context cache is kept "
        "(Gemini's cachedContents storage); the plan's estimate counts it over the run's "
        "estimated time. Default: none (the provider has no explicit cache).",
    )
    batch_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of these prices paid through a batch API (a batched llm.backend: "
        "openai_batch, or another provider's batch backend; 0.5 for OpenAI's, Anthropic's "
        "and Gemini's). Default: 0.5 for a model the built-in price table lists "
        "(factory.llm.pricing), else 1.",
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


class ServeConfig(Section):
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


class LLMConfig(Section):
    """The model and how it is called: endpoints, backend, concurrency, retries, deadlines."""

    model: str = Field(description="Model id, e.g. gpt-5, o4-mini, or a vLLM served name.")
    endpoints: list[EndpointConfig] = Field(
        default_factory=lambda: [
            EndpointConfig(
                base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY", weight=1
            )
        ],
        min_length=1,
        description="One endpoint, or a pool of servers (default: OpenAI's API; with "
        "llm.backend anthropic or gemini, that provider's API and key variable).",
    )
    sampling: dict[str, Any] = Field(
        default_factory=dict,
        description="temperature, top_p, max_tokens / max_completion_tokens, "
        "reasoning_effort, seed.",
    )
    backend: str = Field(
        "aiohttp",
        description="How requests reach the model (factory.llm.backends): aiohttp (lean HTTP "
        "for any OpenAI-compatible server, ~3x less CPU per call), openai (the openai SDK), "
        "openai_batch (the Batch API), anthropic / anthropic_batch (Anthropic's Messages API "
        "and Message Batches), gemini / gemini_batch (Gemini's generateContent and Batch "
        "API), ray_data (Ray Data LLM's HTTP or vLLM engine processor), or a plug-in's name.",
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
