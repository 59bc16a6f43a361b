"""The worker's side: an ``LLMClient`` transport that sends each request to the gateway.

The ``ray_data`` backend is an ``LLMClient`` like ``aiohttp`` (retries, deadlines, the
adaptive limiter, circuit breakers, usage and cost are the client's); only the hop
differs: its transport's ``send`` renders the payload, awaits the gateway's envelope
and reads it (``read_envelope``, pure) into the neutral completion
(``openai_wire.completion_from_openai``), raising what the aiohttp transport
would raise (a timeout, ``aiohttp.ClientConnectionError``, ``HTTPStatusFailure``,
``UnusableResponse``) or an ``InferenceFailure``, so ``factory.llm.errormap`` decides
what each means. A non-2xx status is an error, never a success.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from factory.llm.backends.openai_wire import chat_messages, completion_from_openai
from factory.llm.backends.ray_data.processors import ProcessorSpec, vllm_payload
from factory.llm.errormap import HTTPStatusFailure, InferenceFailure, UnusableResponse
from factory.llm.types import Completion, Request

__all__ = [
    "GatewayChatClient",
    "gateway_name",
    "http_payload",
    "payload_renderer",
    "read_envelope",
]

_FIND_TRIES = 20  # a gateway that just died keeps its name a moment: look again


def gateway_name(run_dir: str, spec: ProcessorSpec) -> str:
    """The gateway's actor name: one per output folder and processor."""
    key = json.dumps([run_dir, repr(spec)]).encode()
    return f"factory-ray-data-{hashlib.sha256(key).hexdigest()[:20]}"


def http_payload(kwargs: dict[str, Any]) -> str:
    """The HTTP processor's payload of one request: the body the aiohttp backend sends
    (same JSON, same bytes) and the request id for ``X-Client-Request-Id``."""
    headers = kwargs.get("extra_headers") or {}
    body = {k: v for k, v in kwargs.items() if k != "extra_headers"}
    return json.dumps(
        {
            "body": json.dumps(body, ensure_ascii=False),
            "request_id": headers.get("X-Client-Request-Id"),
        },
        ensure_ascii=False,
    )


def read_envelope(text: str) -> dict[str, Any]:
    """The response body an envelope holds (decoded JSON), or the failure it reports
    raised as the transport exception ``factory.llm.errormap`` translates (pure).

    Raises:
        TimeoutError: the attempt timed out in the HTTP stage.
        aiohttp.ClientConnectionError: the HTTP stage could not reach the server.
        InferenceFailure: the engine failed the request, or the execution failed.
        HTTPStatusFailure: a non-2xx status (its body and ``Retry-After`` kept).
        UnusableResponse: a 2xx body that is not a JSON object.
    """
    env = json.loads(text)
    error = env.get("error")
    if error:
        kind, message = error.get("kind"), str(error.get("message") or "")
        if kind == "timeout":
            raise TimeoutError(message)
        if kind == "connection":
            raise aiohttp.ClientConnectionError(message)
        raise InferenceFailure(message, retryable=kind != "inference")
    status = int(env.get("status") or 0)
    body = str(env.get("body") or "")
    if not 200 <= status < 300:
        retry_after = env.get("retry_after")
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        raise HTTPStatusFailure(status, body.encode(), headers)
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise UnusableResponse(body[:1000]) from exc
    if not isinstance(answer, dict):
        raise UnusableResponse(body[:1000])
    return answer


class GatewayChatClient:
    """The transport ``LLMClient`` calls (one per endpoint and actor).

    Args:
        name: the gateway's actor name.
        spec: its processor (the first caller creates the gateway with it).
        render: request keyword arguments -> the processor's payload.
        endpoint: the endpoint's name (the completions' ``endpoint``).
    """

    def __init__(
        self,
        name: str,
        spec: ProcessorSpec,
        render: Callable[[dict[str, Any]], str],
        endpoint: str = "",
    ):
        self.name = name
        self.spec = spec
        self.render = render
        self.endpoint = endpoint
        self._handle: Any = None

    async def send(
        self, request: Request, model: str, params: Mapping[str, Any], request_header: str
    ) -> Completion:
        """One attempt through the gateway (``factory.llm.client.Transport``)."""
        kwargs = {
            "model": model,
            "messages": chat_messages(request.messages),
            **params,
            "extra_headers": {"X-Client-Request-Id": request_header},
        }
        body = read_envelope(await self.call(self.render(kwargs)))
        return completion_from_openai(body, self.endpoint, model)

    def _gateway(self) -> Any:
        if self._handle is None:
            import ray

            from factory.llm.backends.ray_data.gateway import Gateway

            self._handle = (
                ray.remote(Gateway)
                .options(
                    name=self.name,
                    get_if_exists=True,
                    num_cpus=0,
                    max_concurrency=100_000,
                    max_restarts=0,
                )
                .remote(self.spec)
            )
        return self._handle

    async def ready(self) -> str:
        """Wait until the gateway's execution took a request ("" then, else why not)."""
        return await self._ask("ready")

    async def call(self, payload: str) -> str:
        """The gateway's envelope for ``payload``; a dead gateway is replaced.

        Raises:
            aiohttp.ClientConnectionError: no live gateway could be reached.
        """
        return await self._ask("call", payload)

    async def _ask(self, method: str, *args: str) -> str:
        import ray

        for _ in range(_FIND_TRIES):
            ref = getattr(self._gateway(), method).remote(*args)
            try:
                return str(await ref)
            except asyncio.CancelledError:
                ray.cancel(ref)  # cut by the deadline: the gateway drops it if not yet sent
                raise
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._handle = None
                await asyncio.sleep(0.1)
        raise aiohttp.ClientConnectionError(f"the Ray Data gateway {self.name} is not reachable")

    async def close(self) -> None:
        """Forget the gateway (it lives as long as the worker that created it)."""
        self._handle = None


def payload_renderer(spec: ProcessorSpec) -> Callable[[dict[str, Any]], str]:
    """How requests become payloads for ``spec``'s processor."""
    return http_payload if spec.kind == "http" else vllm_payload
