"""Async LLM client layer: parameters per model family, pricing, retries, routing.

A pipeline stage calls a backend (``factory.llm.backends``: the protocol and the
registry ``llm.backend`` chooses from) with the wire-neutral request of
``factory.llm.types`` and gets its neutral completion back; the HTTP backends are built on
``LLMClient.complete``, and the rest are its parts, importable on their own for
planning (``PriceTable``), tests and stats. No Ray here: actors build a backend
once and feed it their rows.
"""

from __future__ import annotations

from factory.llm.client import LLMClient, Transport
from factory.llm.deadline import AttemptDeadline
from factory.llm.errormap import translate_error
from factory.llm.params import RequestParams, build_request, model_family, resolve_params
from factory.llm.pool import CircuitState, Endpoint, EndpointPool, EndpointStats, Lease
from factory.llm.pricing import DEFAULT_PRICES, PRICES_AS_OF, Price, PriceTable, cost
from factory.llm.retry import RetryPolicy, RetryResult, call_with_retry, parse_retry_after
from factory.llm.types import Completion, Message, Request, Tool, ToolCall, Usage

__all__ = [
    "DEFAULT_PRICES",
    "PRICES_AS_OF",
    "AttemptDeadline",
    "CircuitState",
    "Completion",
    "Endpoint",
    "EndpointPool",
    "EndpointStats",
    "LLMClient",
    "Lease",
    "Message",
    "Price",
    "PriceTable",
    "Request",
    "RequestParams",
    "RetryPolicy",
    "RetryResult",
    "Tool",
    "ToolCall",
    "Transport",
    "Usage",
    "build_request",
    "call_with_retry",
    "cost",
    "model_family",
    "parse_retry_after",
    "resolve_params",
    "translate_error",
]
