"""A fourth provider as a plug-in package (issue 35, point 7): no change to ``factory/``.

``tests/providers/cohere`` is laid out as another project would ship a provider: its own
distribution, one module mapping the neutral request and completion to Cohere's v2 Chat
API, one entry point in ``factory.llm_backends``, and an offline stand-in of its API
(a relay to the development server). Here it is installed through the real metadata
path, chosen by ``llm.backend`` alone, and run through the factory's own client (retries,
pricing, the response cache's neutral usage).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from factory.llm.backends import (
    BUILTIN_BACKENDS,
    available_backends,
    build_backend,
    builtin_backends,
    get_backend,
    reset_registry,
)
from factory.llm.pricing import Price
from factory.llm.types import Request
from factory.recipe import LLMConfig
from tests.conftest import ROOT, install_distribution, site_on_path

PLUGIN = ROOT / "tests" / "providers" / "cohere"


@pytest.fixture
def cohere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    site = site_on_path(tmp_path / "site", monkeypatch)
    install_distribution(
        site, "factory-cohere", "factory.llm_backends", {"cohere": "factory_cohere.backend:plugin"}
    )
    monkeypatch.syspath_prepend(str(PLUGIN))
    reset_registry()
    yield
    reset_registry()


class Relay:
    """The plug-in's offline API on a port of its own, in a thread with its own loop."""

    def __init__(self, upstream: str):
        from factory_cohere.relay import relay_app

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(relay_app(upstream))
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v2"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_the_built_in_providers_are_found_from_their_modules_alone() -> None:
    found = builtin_backends()
    assert found == BUILTIN_BACKENDS
    assert {"aiohttp", "openai", "openai_batch", "ray_data"} <= set(found)
    assert found["openai_batch"] == "factory.llm.backends.openai_batch:plugin"
    # Framework modules are not backends: they define no plugin.
    assert not {"base", "online", "openai_wire"} & set(found)
    for name, line in found.items():  # each line loads the plug-in of that name
        reset_registry()
        assert get_backend(name).name == name, line


def test_a_provider_plugin_package_runs_with_no_change_to_factory(cohere: None, devserver) -> None:
    assert "cohere" in available_backends() and "cohere" not in BUILTIN_BACKENDS
    server = devserver(seed=3)
    relay = Relay(server.url)
    try:
        llm = LLMConfig.model_validate(
            {
                "model": "factory-dev",
                "backend": "cohere",
                "endpoints": [{"base_url": relay.url}],
                "sampling": {"max_tokens": 800, "temperature": 1.0},
                "retry": {"base_delay_s": 0.05},
            }
        )
        price = Price(2.0, 2.0, 8.0)
        backend = build_backend(llm, llm.model, concurrency=4, price=price)
        requests = [
            Request.of(
                f"r{i}",
                [
                    {"role": "system", "content": "You are a helpful agent."},
                    {"role": "user", "content": f"Say something about flight {i}."},
                ],
                static_prefix=1,
            )
            for i in range(6)
        ]

        async def go() -> list:
            try:
                return [r async for r in backend.run(requests)]
            finally:
                await backend.aclose()

        results = asyncio.run(go())
    finally:
        relay.stop()
    assert sorted(r.request_id for r in results) == [f"r{i}" for i in range(6)]
    for r in results:
        assert r.error is None and r.completion is not None
        c = r.completion
        assert c.text and c.finish_reason == "stop"
        assert c.usage.input > 0 and c.usage.output > 0  # billed units, mapped to Usage
        assert c.cost_usd == pytest.approx((c.usage.input * 2.0 + c.usage.output * 8.0) / 1e6)
    assert server.stats()["by_status"].get("200") == 6
