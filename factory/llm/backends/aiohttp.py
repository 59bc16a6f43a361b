"""Backend ``aiohttp`` (the default): the lean HTTP transport of ``factory.llm.http``.

About 3x less client CPU per call than the openai SDK (BENCHMARKS.md), for any
OpenAI-compatible server (vLLM, SGLang, a provider).
"""

from __future__ import annotations

from factory.llm.backends.base import Backend, BackendOptions, BackendPlugin, BackendSetup
from factory.llm.backends.online import ClientBackend, build_llm_client
from factory.llm.http import aiohttp_client_factory

__all__ = ["AiohttpOptions", "plugin"]


class AiohttpOptions(BackendOptions):
    """No options of its own: endpoints, retries and deadlines are the ``llm`` section's."""


def build(setup: BackendSetup) -> Backend:
    return ClientBackend(build_llm_client(setup, aiohttp_client_factory))


plugin = BackendPlugin("aiohttp", AiohttpOptions, build)
