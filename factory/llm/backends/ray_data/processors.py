"""The Ray Data LLM processors the gateway runs, and what goes in and out of them (pure).

The gateway runs a processor's *stages* (``processor.stages``: the HTTP stage, or chat
template, tokenize, engine, detokenize) over rows already in the processor's internal
layout (``processor_row``), and reads their output rows itself (``read_output``): the
processor's own preprocess and postprocess are row maps, each a Ray task per block,
which cost more than the requests on a small machine and add nothing here. A request
is the gateway's token for the waiting caller and the request as JSON; what comes back
is that token and an envelope (``session.envelope``'s format: a status and an OpenAI
response body, or a failure), so the gateway and the factory's side (``transport``) do
not know which processor ran:

- ``http``: ``HttpRequestProcessorConfig`` with this package's ``SessionFactory``; the
  payload is ``{"body": <the request body the aiohttp backend sends>, "request_id"}``.
- ``vllm``: ``vLLMEngineProcessorConfig`` (chat template, tokenize, the engine,
  detokenize on Ray Data actor pools); the payload is ``{"messages", "sampling_params"}``
  and ``vllm_envelope`` turns the engine's row (``generated_text``,
  ``num_input_tokens``, ``num_generated_tokens``, ``__inference_error__``) into an
  OpenAI-shaped body, so usage and cost are read as for any server.

All columns are scalars (strings and an int): Arrow never has to unify the nested
schemas of different requests and answers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from factory.llm.backends.ray_data.session import FILLER, SessionFactory, envelope

__all__ = [
    "TOKEN",
    "ProcessorSpec",
    "build_processor",
    "concurrent_batches",
    "filler_payload",
    "processor_row",
    "read_output",
    "vllm_envelope",
    "vllm_payload",
    "vllm_sampling",
]

TOKEN = "factory_token"

# OpenAI request keys vLLM's SamplingParams takes under the same name.
_VLLM_SAME = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "n")


@dataclass(frozen=True)
class ProcessorSpec:
    """Everything a gateway needs to build its processor (picklable; its hash names the
    gateway, so two stages with the same spec share one execution).

    Attributes:
        kind: ``http`` or ``vllm``.
        batch_size: rows per batch of the processor's LLM stage.
        replicas: actors of that stage (HTTP actors, or vLLM engines).
        concurrent_batches: batches one replica works on at once.
        num_cpus: CPUs each HTTP actor reserves.
        url: the chat completions URL (``http``).
        api_key_env: variable holding the key, read in the HTTP actors (``http``).
        timeout_s: one HTTP attempt's limit (``http``).
        model: the model id written into answers (``vllm``: the served name).
        model_source: the weights (``vllm``: a hub id or a path).
        engine_kwargs: ``vllm.LLM`` arguments (``vllm``), as JSON.
        accelerator_type: e.g. ``H100`` (``vllm``).
        extra: further ``vLLMEngineProcessorConfig`` fields, as JSON (``vllm``).
    """

    kind: Literal["http", "vllm"]
    batch_size: int
    replicas: int
    concurrent_batches: int
    num_cpus: float = 0.25
    url: str = ""
    api_key_env: str | None = None
    timeout_s: float = 600.0
    model: str = ""
    model_source: str = ""
    engine_kwargs: str = "{}"
    accelerator_type: str | None = None
    extra: str = "{}"

    @property
    def in_flight(self) -> int:
        """Requests the processor works on at once at most."""
        return self.replicas * self.concurrent_batches * self.batch_size


def filler_payload(kind: str) -> str:
    """The payload of a row that pads a batch: answered by the HTTP session without a
    request; one token of a one-character prompt for the engine."""
    if kind == "http":
        return FILLER
    return json.dumps(
        {"messages": [{"role": "user", "content": "."}], "sampling_params": {"max_tokens": 1}}
    )


def vllm_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` from OpenAI request parameters (pure): ``max_tokens`` /
    ``max_completion_tokens`` become ``max_tokens``; the others vLLM knows keep their name;
    the rest (``reasoning_effort`` ...) mean nothing to a local engine and are dropped."""
    out = {k: params[k] for k in _VLLM_SAME if params.get(k) is not None}
    limit = params.get("max_completion_tokens") or params.get("max_tokens")
    if limit:
        out["max_tokens"] = int(limit)
    return out


def vllm_payload(request: dict[str, Any]) -> str:
    """The engine's payload of one request (its messages and sampling parameters)."""
    params = {k: v for k, v in request.items() if k not in ("model", "messages", "extra_headers")}
    return json.dumps(
        {"messages": request["messages"], "sampling_params": vllm_sampling(params)},
        ensure_ascii=False,
    )


def vllm_envelope(row: dict[str, Any], model: str) -> str:
    """The envelope of one engine output row (pure): an OpenAI-shaped body whose usage
    is the engine's token counts, or the row's ``__inference_error__`` as a failure."""
    error = row.get("__inference_error__") or ""
    if error:
        return envelope(error=("inference", str(error)))
    prompt = int(row.get("num_input_tokens") or 0)
    generated = int(row.get("num_generated_tokens") or 0)
    limit = (row.get("sampling_params") or {}).get("max_tokens")
    finish = "length" if limit and generated >= int(limit) else "stop"
    body = {
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": row.get("generated_text") or ""},
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "total_tokens": prompt + generated,
        },
    }
    return envelope(status=200, body=json.dumps(body, ensure_ascii=False))


def processor_row(kind: str, token: int, payload: str) -> dict[str, Any]:
    """The row a processor's first stage reads (the processor's ``__data`` column; pure):
    the HTTP stage's ``payload``, or the engine's ``messages`` and ``sampling_params``."""
    if kind == "http":
        return {TOKEN: token, "payload": payload}
    request = json.loads(payload)
    return {
        TOKEN: token,
        "messages": request["messages"],
        "sampling_params": request["sampling_params"],
    }


def read_output(row: dict[str, Any], model: str) -> tuple[int, str]:
    """(token, envelope) of one row the processor's last stage wrote (pure)."""
    token = int(row[TOKEN])
    response = row.get("http_response")
    if response is not None:
        return token, str(response["envelope"])
    return token, vllm_envelope(row, model)


def build_processor(spec: ProcessorSpec) -> Any:
    """The Ray Data LLM processor ``spec`` describes (imports Ray Data LLM; in the gateway).

    Both keep ``spec.concurrent_batches`` batches of ``spec.batch_size`` rows at work in
    each of ``spec.replicas`` actors. Ray's defaults would keep one batch per HTTP actor,
    its requests awaited one after another (see ``session``).
    """
    from ray.data import ActorPoolStrategy
    from ray.data.llm import HttpRequestProcessorConfig, vLLMEngineProcessorConfig
    from ray.data.llm import build_processor as build

    if spec.kind == "http":
        config = HttpRequestProcessorConfig(
            url=spec.url,
            batch_size=spec.batch_size,
            concurrency=spec.replicas,
            session_factory=SessionFactory(spec.api_key_env, spec.timeout_s),
            http_request_stage={
                "concurrency": (spec.replicas, spec.replicas),
                "num_cpus": spec.num_cpus,
            },
        )
        processor = build(config)
        stage = processor.get_stage_by_name("HttpRequestStage")
        kwargs = dict(stage.map_batches_kwargs)
        kwargs["compute"] = ActorPoolStrategy(
            size=spec.replicas,
            max_tasks_in_flight_per_actor=spec.concurrent_batches,
            max_concurrent_calls_per_actor=spec.concurrent_batches,
        )
        stage.map_batches_kwargs = kwargs
        return processor
    engine = vLLMEngineProcessorConfig(
        model_source=spec.model_source,
        engine_kwargs=json.loads(spec.engine_kwargs),
        batch_size=spec.batch_size,
        concurrency=spec.replicas,
        max_concurrent_batches=spec.concurrent_batches,
        accelerator_type=spec.accelerator_type,
        should_continue_on_error=True,
        **json.loads(spec.extra),
    )
    return build(engine)


def concurrent_batches(concurrency: int, replicas: int, batch_size: int) -> int:
    """Batches per replica so that ``concurrency`` requests can be at work at once."""
    return max(1, math.ceil(concurrency / (replicas * batch_size)))
