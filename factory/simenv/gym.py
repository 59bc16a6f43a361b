"""A plain gymnasium-style class for in-process use (no server, no gymnasium dependency).

``reset(seed=, options={"task": id_or_index})`` returns ``(observation, info)`` and
``step(action)`` returns ``(observation, reward, terminated, truncated, info)``, the
gymnasium 0.26+ signatures, so a trainer loop written for gymnasium drives it as it
is. The episode logic is ``SimEnv``'s (async); this class owns one event loop and runs
each call to completion on it, which is what a synchronous caller needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from factory.simenv.runtime import Runtime

__all__ = ["GymEnv"]


class GymEnv:
    """One environment of a :class:`Runtime`; ``close()`` when done.

    Args:
        runtime: the shared spec, LLM, cache and settings.
    """

    def __init__(self, runtime: Runtime):
        self._loop = asyncio.new_event_loop()
        self._runtime = runtime
        self.env = self._loop.run_until_complete(self._make())

    async def _make(self) -> Any:
        return self._runtime.new_env()  # the LLM's backend is built on this loop

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        task = (options or {}).get("task")
        obs = self._loop.run_until_complete(self.env.reset(task, seed=seed or 0))
        return obs, {"task_id": obs["task_id"], "episode_id": obs["episode_id"]}

    def step(
        self, action: Mapping[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        r = self._loop.run_until_complete(self.env.step(action))
        return r.observation, r.reward, r.done and not r.truncated, r.truncated, r.info

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._runtime.aclose())
            self._loop.close()
