"""Running the development server: on the current event loop, or in a thread of its own.

Why apart from ``factory.devserver.app``: the app says how a request is answered;
this module only binds ``127.0.0.1``, serves and stops (``python -m
factory.devserver`` on its loop, tests and benchmarks in a background thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from factory.devserver.app import _STATE, HOST, DevServerConfig, _State, build_app

__all__ = ["DevServer", "RunningServer", "start_server", "warm"]

log = logging.getLogger(__name__)


@dataclass
class RunningServer:
    """A started server on the current event loop."""

    url: str
    port: int
    state: _State

    async def wait_dead(self) -> None:
        """Return once the server died (``/admin/stop``, ``fail_after``) or was closed."""
        assert self.state.died is not None
        await self.state.died.wait()

    async def close(self) -> None:
        self.state.die()
        await self.wait_dead()
        self.state.drop_connections()  # any accepted while it was dying
        await asyncio.sleep(0)  # let the resets run before the loop may stop


def warm() -> None:
    """Derive what every answer reads (each registered domain's vocabulary and enums,
    which generate a world per domain: ~0.8 s) before the port opens.

    Why: done on the first request, it held the server's event loop, so every other
    connection waited behind it and a client's first burst arrived one request first,
    the rest 0.8 s later (seen in the peer benchmark's request logs).
    """
    from factory.devserver import domains

    try:
        domains.vocabulary()
        domains.enums()
    except Exception:  # a broken plug-in: the request that needs it reports it
        log.warning("could not derive the domains' vocabulary at start", exc_info=True)


async def start_server(config: DevServerConfig) -> RunningServer:
    """Bind ``127.0.0.1:config.port`` and serve on the running loop."""
    warm()
    app = build_app(config)
    state = app[_STATE]
    state.died = asyncio.Event()
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    assert runner.server is not None
    state.track_connections(runner.server)
    site = web.TCPSite(runner, HOST, config.port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    state.runner = runner
    port = int(runner.addresses[0][1])
    return RunningServer(url=f"http://{HOST}:{port}/v1", port=port, state=state)


class DevServer:
    """The dev server in a background thread with its own event loop, for tests and benchmarks.

    Usage::

        with DevServer(DevServerConfig(latency_ms=50)) as server:
            client = openai.OpenAI(base_url=server.url, api_key="test")
    """

    def __init__(self, config: DevServerConfig | None = None) -> None:
        self.config = config or DevServerConfig()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: RunningServer | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the OpenAI ``base_url``."""
        if self._server is None:
            raise RuntimeError("the devserver is not started")
        return self._server.url

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the devserver is not started")
        return self._server.port

    def start(self) -> DevServer:
        """Start serving; returns once the port is bound.

        Raises:
            OSError: the port could not be bound.
        """
        if self._thread is not None:
            raise RuntimeError("the devserver is already started")
        loop = asyncio.new_event_loop()
        started: asyncio.Future[RunningServer] = loop.create_future()
        ready = threading.Event()

        async def boot() -> None:
            try:
                started.set_result(await start_server(self.config))
            except BaseException as exc:  # reported to the starting thread
                started.set_exception(exc)
            finally:
                ready.set()

        def run() -> None:
            asyncio.set_event_loop(loop)
            booting = loop.create_task(boot())
            loop.run_forever()
            booting.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="factory-devserver", daemon=True)
        self._thread.start()
        ready.wait(30)
        if not started.done() or started.exception() is not None:
            self._stop_loop()
            exc = started.exception() if started.done() else TimeoutError("devserver did not start")
            raise exc or RuntimeError("devserver did not start")
        self._server = started.result()
        return self

    def stats(self) -> dict[str, Any]:
        """Counters as ``GET /stats`` reports them."""
        if self._server is None:
            raise RuntimeError("the devserver is not started")
        return self._server.state.snapshot()

    def stop(self) -> None:
        """Close every connection, stop listening and end the thread (idempotent)."""
        if self._loop is None:
            return
        if self._server is not None and self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._server.close(), self._loop)
            with contextlib.suppress(Exception):
                future.result(timeout=10)
        self._stop_loop()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = None
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
