"""What one environment server holds: the domain spec, the LLM settings, the episode factory.

Why one object: an OpenEnv server makes a new environment per WebSocket session,
and every one of them must share the same domain spec (one base world, tasks),
one response cache, one budget and one backend (its connection pool and
concurrency limit), while owning its own world fork. ``Runtime.new_env()`` is that
factory. The backend is built lazily on the event loop that first uses it (an
aiohttp session belongs to one loop).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.io.cache import ResponseCache
from factory.llm.backends import build_backend
from factory.llm.pricing import PriceTable
from factory.recipe import EndpointConfig, LLMConfig
from factory.simenv.env import SimEnv
from factory.simenv.llm import RoleLLM
from factory.simenv.rollout import RolloutWriter
from factory.simenv.spec import DomainSpec
from factory.simenv.tasks import DerivedTasks, load_tasks, tasks_from_seeds

__all__ = ["EnvSettings", "Runtime", "llm_config"]


def llm_config(base_url: str, model: str, **kw: Any) -> LLMConfig:
    """The ``llm`` section for one OpenAI-compatible endpoint (the key, if any, by env var)."""
    api_key_env = kw.pop("api_key_env", None)
    return LLMConfig(
        model=model,
        endpoints=[EndpointConfig(base_url=base_url, api_key_env=api_key_env, weight=1)],
        **kw,
    )


@dataclass
class EnvSettings:
    """How episodes are played (the ``serve`` command's options)."""

    mode: str = "executor"
    judge: bool = True
    reward: str = "auto"
    simulate_tools: frozenset[str] = frozenset()
    max_steps: int = 60


@dataclass
class Runtime:
    """Shared by every episode of one server process.

    Args:
        spec: the served domain.
        llm: the ``llm`` section (endpoints, model, sampling, retries) or None (no LLM roles).
        cache: the response cache every role answer goes through, or None.
        budget: a ``BudgetState`` or ``BudgetActor`` handle shared by the episodes.
        settings: the episode settings.
        concurrency: LLM requests in flight at once from this process.
        model: the model id of request ids when there is no ``llm`` (a replay from the cache).
        rollouts: where every finished episode is written as a training row, or None.

    Attributes:
        derived: for tasks derived from seeds, what the derivation gave (else None).
    """

    spec: DomainSpec
    llm: LLMConfig | None = None
    cache: ResponseCache | None = None
    budget: Any = None
    settings: EnvSettings = field(default_factory=EnvSettings)
    concurrency: int = 256
    model: str = "factory-dev"
    rollouts: RolloutWriter | None = None
    derived: DerivedTasks | None = field(default=None, init=False)
    _role_llm: RoleLLM | None = field(default=None, init=False, repr=False)

    @classmethod
    def create(
        cls,
        domain: str,
        *,
        tasks: str | Path | None = None,
        seeds: str | Path | None = None,
        db: str | Path | None = None,
        world_seed: int | None = None,
        base_url: str | None = None,
        model: str = "factory-dev",
        api_key_env: str | None = None,
        cache_dir: str | Path | None = None,
        settings: EnvSettings | None = None,
        concurrency: int = 256,
        budget: Any = None,
        rollouts: str | Path | None = None,
    ) -> Runtime:
        """A runtime from command-line style options (``python -m factory.simenv serve``).

        Tasks come from a tau-bench-style file (``tasks``) or are derived from seed
        trajectories (``seeds``: a file, folder or glob) by the role LLM before the
        first episode, through the cache (a restart derives them again for free).
        ``derived`` then says which seeds gave no task and why.

        Raises:
            ConfigError: neither or both of ``tasks`` and ``seeds``; seeds without an
                LLM or a cache; no seed gave a task.
        """
        if (tasks is None) == (seeds is None):
            raise ConfigError(
                "give exactly one of a task file (tasks) and seed trajectories (seeds)",
                key_path="tasks",
            )
        llm = (
            llm_config(base_url, model, concurrency=concurrency, api_key_env=api_key_env)
            if base_url
            else None
        )
        # Servers of a fleet share the folder: a miss is about to pay for a call, so it
        # first looks at what the other servers wrote (no 1 s refresh throttle).
        cache = (
            ResponseCache(str(cache_dir), refresh_interval_s=0.0) if cache_dir is not None else None
        )
        derived = None
        if seeds is not None:
            derived = _derive(domain, seeds, _role_llm(llm, model, cache, budget, concurrency))
            task_list = derived.tasks
        else:
            assert tasks is not None
            task_list = load_tasks(tasks)
        spec = DomainSpec.load(domain, tasks=task_list, db=db, world_seed=world_seed)
        writer = RolloutWriter(rollouts) if rollouts is not None else None
        runtime = cls(
            spec, llm, cache, budget, settings or EnvSettings(), concurrency, model, writer
        )
        runtime.derived = derived
        return runtime

    def role_llm(self) -> RoleLLM | None:
        """The shared LLM of the roles (built on first use, on the caller's loop)."""
        if self._role_llm is None:
            self._role_llm = _role_llm(
                self.llm, self.model, self.cache, self.budget, self.concurrency
            )
        return self._role_llm

    def new_env(self) -> SimEnv:
        """A fresh environment for one session (its episodes fork the base world)."""
        s = self.settings
        return SimEnv(
            self.spec,
            mode=s.mode,
            llm=self.role_llm(),
            judge=s.judge,
            reward=s.reward,
            simulate_tools=s.simulate_tools,
            max_steps=s.max_steps,
        )

    def record(self, env: SimEnv) -> None:
        """Write ``env``'s finished episode to the rollouts, when they are kept."""
        if self.rollouts is not None:
            self.rollouts.add(env)

    async def aclose(self) -> None:
        """Close the LLM backend, flush the cache and finish the rollout shards."""
        if self.rollouts is not None:
            self.rollouts.close()
        if self._role_llm is not None:
            await self._role_llm.aclose()
            self._role_llm = None
        elif self.cache is not None:
            self.cache.flush()


def _role_llm(
    llm: LLMConfig | None,
    model: str,
    cache: ResponseCache | None,
    budget: Any,
    concurrency: int,
) -> RoleLLM | None:
    """A role LLM on ``llm``'s endpoint, or a replay-only one on ``cache``, or None."""
    if llm is None and cache is None:
        return None
    backend = None
    if llm is not None:
        price = PriceTable.from_config(None).lookup(llm.model)
        backend = build_backend(llm, llm.model, concurrency=concurrency, price=price)
    return RoleLLM(
        backend,
        model=llm.model if llm else model,
        sampling=llm.sampling if llm else {},
        cache=cache,
        budget=budget,
        concurrency=concurrency,
    )


def _derive(domain: str, seeds: str | Path, llm: RoleLLM | None) -> DerivedTasks:
    """Tasks from ``seeds`` on a loop of their own; the LLM is closed before serving
    (its connection pool belongs to this loop, the server's episodes get another)."""
    if llm is None:
        raise ConfigError(
            "deriving tasks from seeds needs an LLM (an endpoint, or a cache of its answers)",
            key_path="seeds",
        )
    pack = DomainSpec.pack_of(domain)

    async def run() -> DerivedTasks:
        try:
            return await tasks_from_seeds(
                seeds, llm, default_tools=pack.tools, write_tools=pack.write_tools()
            )
        finally:
            await llm.aclose()

    derived = asyncio.run(run())
    if not derived.tasks:
        why = (derived.failed + derived.rejected)[:3]
        raise ConfigError(f"no seed of {seeds} gave a task: {why}", key_path="seeds")
    return derived
