"""The OpenEnv server: simulated episodes where RL trainers look for environments.

Why openenv-core itself and not a look-alike: TRL, verl, SkyRL and torchforge talk
to OpenEnv servers through its client (``openenv.core.EnvClient``); serving its own
``create_fastapi_app`` with its typed ``Action``/``Observation``/``State`` makes the
schemas (``/schema``), the HTTP routes (``/reset``, ``/step``, ``/state``,
``/health``) and the WebSocket session protocol (``/ws``: one environment per
connection, ``reset``/``step``/``state``/``close`` messages) exactly the library's.

Each WebSocket session gets its own :class:`OpenEnvSimEnv`, hence its own world
fork per episode; all sessions share one :class:`~factory.simenv.runtime.Runtime`
(domain spec, LLM backend, response cache, budget). Stateless HTTP ``/reset`` and
``/step`` build a throw-away environment per request, as openenv-core does: a
multi-step episode needs the WebSocket.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field
from starlette.websockets import WebSocketDisconnect

from factory.errors import ConfigError
from factory.simenv.runtime import Runtime

__all__ = [
    "OpenEnvSimEnv",
    "SimAction",
    "SimClient",
    "SimObservation",
    "SimState",
    "ThreadedServer",
    "build_app",
]


class SimAction(Action):
    """The agent's next message: text to the user, or a tool call (``tool_name``)."""

    content: str = Field("", description="Text to the user (or said alongside a tool call).")
    tool_name: str | None = Field(None, description="The tool to call; None for a message.")
    arguments: dict[str, Any] | str | None = Field(
        None, description="The call's arguments: an object or its JSON text."
    )


class SimObservation(Observation):
    """What the agent sees: the user's reply or the tool's output (plus, at reset, the
    system prompt and the tools)."""

    role: str = Field("user", description="'user' (the user spoke) or 'tool' (a tool answered).")
    content: str = Field("", description="The user's message or the tool's output.")
    name: str | None = Field(None, description="The tool that answered.")
    system: str | None = Field(None, description="The system prompt (the policy), at reset.")
    tools: list[dict[str, Any]] | None = Field(None, description="Tool specs, at reset.")
    task_id: str | None = None
    episode_id: str | None = None
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="Validation problems, who answered, consistency; rewards at the end.",
    )


class SimState(State):
    """The episode's bookkeeping (extra keys: task_id, mode, counts, rewards)."""


class OpenEnvSimEnv(Environment[SimAction, SimObservation, SimState]):
    """One session's environment over a shared runtime (async: it awaits the LLM)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, runtime: Runtime):
        super().__init__()
        self.runtime = runtime
        self.sim = runtime.new_env()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> SimObservation:
        raise NotImplementedError("the simulated environment is async: use reset_async")

    def step(
        self, action: SimAction, timeout_s: float | None = None, **kwargs: Any
    ) -> SimObservation:
        raise NotImplementedError("the simulated environment is async: use step_async")

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        task_index: int | None = None,
        **kwargs: Any,
    ) -> SimObservation:
        """Start an episode: ``task_id`` or ``task_index`` picks the task, else ``seed`` does."""
        task = task_id if task_id is not None else task_index
        obs = await self.sim.reset(task, seed=seed or 0, episode_id=episode_id)
        return SimObservation(**obs, done=self.sim.done, reward=None)

    async def step_async(
        self, action: SimAction, timeout_s: float | None = None, **kwargs: Any
    ) -> SimObservation:
        if action.tool_name:
            step = {"name": action.tool_name, "arguments": action.arguments}
            step["content"] = action.content
        else:
            step = {"content": action.content}
        r = await self.sim.step(step)
        if r.done:
            self.runtime.record(self.sim)
        return SimObservation(**r.observation, done=r.done, reward=r.reward, info=r.info)

    @property
    def state(self) -> SimState:
        s = self.sim.state()
        return SimState(**{**s, "episode_id": s["episode_id"] or None})


def build_app(runtime: Runtime, *, max_sessions: int = 256) -> Any:
    """The FastAPI app (openenv-core's) serving ``runtime``'s episodes.

    The role LLM is built when the app starts (on the server's loop) and closed when
    it stops, so its connections and the cache's buffers are released.
    """
    app = create_fastapi_app(
        lambda: OpenEnvSimEnv(runtime),
        SimAction,
        SimObservation,
        max_concurrent_envs=max_sessions,
    )

    async def start() -> None:
        runtime.role_llm()

    async def stop() -> None:
        await runtime.aclose()

    app.router.on_startup.append(start)
    app.router.on_shutdown.append(stop)
    app.add_middleware(_ClientLeft)
    return app


class _ClientLeft:
    """Ends a WebSocket session quietly when the client has already gone.

    openenv-core 0.3.0's ``/ws`` handler, once a session ends, destroys the
    environment and then closes the socket, catching only ``RuntimeError``; when the
    client closed first (the normal end of an episode), starlette raises
    ``WebSocketDisconnect`` there and uvicorn logs a 40-line traceback for every
    finished session. Nothing is left to do by then, so the exception ends here.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            return


class SimClient(EnvClient[SimAction, SimObservation, SimState]):
    """The OpenEnv client of this server (what a trainer uses; WebSocket sessions)."""

    def _step_payload(self, action: SimAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SimObservation]:
        obs = SimObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation=obs, reward=payload.get("reward"), done=obs.done)

    def _parse_state(self, payload: dict[str, Any]) -> SimState:
        return SimState(**payload)


class ThreadedServer:
    """The app under uvicorn in a background thread (tests, benchmarks, notebooks).

    Usage::

        with ThreadedServer(build_app(runtime)) as server:
            async with SimClient(base_url=server.url) as env: ...
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, timeout_s: float = 120.0) -> ThreadedServer:
        """Serve; returns once the socket is bound.

        Raises:
            ConfigError: the server did not start within ``timeout_s``.
        """
        self._thread = threading.Thread(target=self._run, name="simenv-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError("the simulated environment server did not start")
            time.sleep(0.02)
        sock = self._server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=60)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
