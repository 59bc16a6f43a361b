"""Backend ``openai``: the official openai SDK as the transport.

For servers or proxies that only the SDK speaks to correctly; the SDK's own
retries are off (``LLMClient`` retries, with one policy for every backend).
"""

from __future__ import annotations

from factory.llm.backends.base import Backend, BackendOptions, BackendPlugin, BackendSetup
from factory.llm.backends.online import ClientBackend, build_llm_client
from factory.llm.client import openai_client_factory

__all__ = ["OpenAIOptions", "plugin"]


class OpenAIOptions(BackendOptions):
    """No options of its own: endpoints, retries and deadlines are the ``llm`` section's."""


def build(setup: BackendSetup) -> Backend:
    return ClientBackend(build_llm_client(setup, openai_client_factory))


plugin = BackendPlugin("openai", OpenAIOptions, build)
