"""Backend ``ray_data``: the LLM stage's call made by a Ray Data LLM processor.

``ray.data.llm``'s processors (``HttpRequestProcessorConfig`` now; the vLLM engine
processor, ``vLLMEngineProcessorConfig``, on GPUs) plug in as the *call* of an LLM stage
inside the run's one execution: render and record stay the stage's (request ids, the
response cache, budget, usage and cost), and each request travels worker -> gateway
(``gateway``: one Ray Data execution per run, so an engine loads its weights once) ->
processor -> back, read by ``transport``. Retries, deadlines and the error map are the
``LLMClient``'s, as for ``aiohttp``. See docs/backends.md for when to pick it.

Recipe::

    llm:
      backend: ray_data
      backend_options: {processor: http, batch_size: 1, replicas: 2}
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from factory.llm.backends.base import Backend, BackendOptions, BackendPlugin, BackendSetup
from factory.llm.backends.online import ClientBackend, build_llm_client
from factory.llm.backends.ray_data.processors import ProcessorSpec, concurrent_batches
from factory.llm.backends.ray_data.transport import (
    GatewayChatClient,
    gateway_name,
    payload_renderer,
)
from factory.llm.client import LLMClient
from factory.llm.pool import Endpoint
from factory.llm.types import Completion, Request

__all__ = ["RayDataBackend", "RayDataOptions", "VllmOptions", "plugin", "specs"]

log = logging.getLogger(__name__)

# The vLLM engine is reached by no URL; the endpoint pool still wants one to name it.
_IN_PROCESS_URL = "http://ray-data.invalid/v1"


class VllmOptions(BaseModel):
    """The engine of ``processor: vllm`` (``vLLMEngineProcessorConfig``)."""

    model_config = ConfigDict(extra="forbid")

    model_source: str | None = Field(
        None, description="Weights: a Hugging Face id or a path (default: the stage's model)."
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm.LLM arguments, e.g. {tensor_parallel_size: 1, max_model_len: 16384}.",
    )
    accelerator_type: str | None = Field(None, description="e.g. H100, A100 (Ray's names).")
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLMEngineProcessorConfig fields (runtime_env, "
        "placement_group_config, max_pending_requests ...).",
    )


class RayDataOptions(BackendOptions):
    """``llm.backend_options`` of ``ray_data``."""

    processor: Literal["http", "vllm"] = Field(
        "http",
        description="http: Ray Data LLM's HTTP processor to llm.endpoints; vllm: "
        "the vLLM engine processor on this cluster's GPUs.",
    )
    batch_size: int = Field(
        1, ge=1, description="Rows per batch of the processor's LLM stage (vllm: 16-64)."
    )
    replicas: int = Field(
        1, ge=1, description="Actors of that stage: HTTP actors, or vLLM engines."
    )
    concurrent_batches: int | None = Field(
        None,
        ge=1,
        description="Batches one replica works on at once (default: enough for "
        "llm.concurrency requests in flight).",
    )
    num_cpus: float = Field(0.25, gt=0, description="CPUs each HTTP actor reserves.")
    vllm: VllmOptions | None = Field(None, description="The engine (processor: vllm).")

    @model_validator(mode="after")
    def _vllm_only_for_vllm(self) -> RayDataOptions:
        if self.processor == "http" and self.vllm is not None:
            raise ValueError("vllm options apply to processor: vllm only")
        return self


def specs(setup: BackendSetup) -> list[tuple[Endpoint, ProcessorSpec]]:
    """The processor behind each endpoint the stage's client routes over (pure): one
    HTTP processor per ``llm.endpoints`` entry, or the one engine."""
    options = setup.options
    assert isinstance(options, RayDataOptions)
    llm = setup.llm
    batches = options.concurrent_batches or concurrent_batches(
        llm.concurrency, options.replicas, options.batch_size
    )
    common = dict(
        batch_size=options.batch_size, replicas=options.replicas, concurrent_batches=batches
    )
    if options.processor == "vllm":
        vllm = options.vllm or VllmOptions.model_validate({})
        spec = ProcessorSpec(
            kind="vllm",
            model=setup.model,
            model_source=vllm.model_source or setup.model,
            engine_kwargs=json.dumps(vllm.engine_kwargs, sort_keys=True),
            accelerator_type=vllm.accelerator_type,
            extra=json.dumps(vllm.extra, sort_keys=True),
            **common,  # type: ignore[arg-type]
        )
        name = f"ray_data:vllm:{spec.model_source}"
        return [(Endpoint(base_url=_IN_PROCESS_URL, name=name), spec)]
    out = []
    for e in llm.endpoints:
        endpoint = Endpoint(base_url=e.base_url, api_key_env=e.api_key_env, weight=e.weight)
        spec = ProcessorSpec(
            kind="http",
            url=e.base_url.rstrip("/") + "/chat/completions",
            api_key_env=e.api_key_env,
            timeout_s=llm.timeout_s,
            num_cpus=options.num_cpus,
            **common,  # type: ignore[arg-type]
        )
        out.append((endpoint, spec))
    return out


class RayDataBackend(ClientBackend):
    """``ClientBackend`` whose first request waits until the gateways' executions run.

    Why: starting a Ray Data execution (its actors; a vLLM engine's weights) takes
    seconds to minutes, and inside the first attempts' deadlines that wait would read
    as hung attempts, retried and reported as a failing endpoint.
    """

    def __init__(self, client: LLMClient, gateways: list[GatewayChatClient]):
        super().__init__(client)
        self.gateways = gateways
        self._warm: asyncio.Future[None] | None = None

    async def _warm_up(self) -> None:
        for gateway, why in zip(
            self.gateways, await asyncio.gather(*(g.ready() for g in self.gateways)), strict=True
        ):
            if why:
                log.warning("the Ray Data processor of %s did not start: %s", gateway.name, why)

    async def complete(self, request: Request) -> Completion:
        if self._warm is None:
            self._warm = asyncio.ensure_future(self._warm_up())
        await asyncio.shield(self._warm)
        return await super().complete(request)


def build(setup: BackendSetup) -> Backend:
    """An ``LLMClient`` whose transport is the gateway of each endpoint's processor.

    Raises:
        ConfigError: bad sampling options, a missing key (naming its variable).
    """
    pairs = specs(setup)
    by_name = {endpoint.name: spec for endpoint, spec in pairs}
    run_dir = setup.run_dir or ""
    gateways: list[GatewayChatClient] = []

    def client_factory(endpoint: Endpoint, api_key: str, timeout_s: float) -> GatewayChatClient:
        del api_key, timeout_s  # read by the HTTP actors themselves; the client times attempts
        spec = by_name[endpoint.name]
        gateway = GatewayChatClient(
            gateway_name(run_dir, spec), spec, payload_renderer(spec), endpoint.name
        )
        gateways.append(gateway)
        return gateway

    client = build_llm_client(setup, client_factory, [e for e, _ in pairs])
    return RayDataBackend(client, gateways)


plugin = BackendPlugin("ray_data", RayDataOptions, build)
