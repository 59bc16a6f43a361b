"""N environment servers as Ray actors beside the trainer: one response cache, one budget.

Why actors: an RL trainer (verl, SkyRL, TRL) runs many environment workers; one
server process holds one event loop and one connection pool, so a large rollout
wants several, placed by Ray next to the trainer's workers. They must still behave
as one environment: a role answer one server paid for is replayed by every other
(the cache folder is shared: each process appends to its own segment file and reads
the others', ``factory.io.cache``), and the budget caps hold across all of them
(one named ``BudgetActor``, ``factory.engine.budget``, that every role call asks
before it is sent).

Usage (the URLs go to the trainer's environment workers)::

    fleet = start_env_servers(4, FleetSpec(domain="airline", tasks=..., db=...,
                                            base_url=..., cache_dir="/shared/cache"),
                              caps={"max_cost_usd": 50.0})
    fleet.urls            # ["http://10.0.0.5:41231", ...]
    fleet.spend()         # the shared budget's totals
    fleet.stop()
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from factory.engine.budget import budget_actor
from factory.errors import ConfigError
from factory.simenv.runtime import EnvSettings, Runtime
from factory.simenv.server import ThreadedServer, build_app

__all__ = ["EnvServer", "Fleet", "FleetSpec", "start_env_servers"]


@dataclass(frozen=True)
class FleetSpec:
    """What every server of a fleet serves (``Runtime.create``'s options, picklable).

    ``host`` is where each server binds: ``0.0.0.0`` to reach it from other nodes
    (its URL then names the node's IP), ``127.0.0.1`` for one machine. Tasks come
    from ``tasks`` (a task file) or ``seeds`` (derived by the LLM, as ``serve --seeds``).
    """

    domain: str
    tasks: str | None = None
    seeds: str | None = None
    db: str | None = None
    world_seed: int | None = None
    base_url: str | None = None
    model: str = "factory-dev"
    api_key_env: str | None = None
    cache_dir: str | None = None
    settings: dict[str, Any] = field(default_factory=lambda: asdict(EnvSettings()))
    concurrency: int = 256
    max_sessions: int = 256
    host: str = "127.0.0.1"


class EnvServer:
    """One OpenEnv server in a Ray actor (``ThreadedServer`` over ``build_app``)."""

    def __init__(self, spec: FleetSpec, budget: Any) -> None:
        settings = EnvSettings(**spec.settings)
        self.runtime = Runtime.create(
            spec.domain,
            tasks=spec.tasks,
            seeds=spec.seeds,
            db=spec.db,
            world_seed=spec.world_seed,
            base_url=spec.base_url,
            model=spec.model,
            api_key_env=spec.api_key_env,
            cache_dir=spec.cache_dir,
            settings=settings,
            concurrency=spec.concurrency,
            budget=budget,
        )
        app = build_app(self.runtime, max_sessions=spec.max_sessions)
        self.server = ThreadedServer(app, host=spec.host, port=0).start()
        self.host = spec.host

    def url(self) -> str:
        """The server's URL, reachable from other nodes when it binds ``0.0.0.0``."""
        if self.host not in ("0.0.0.0", "::"):
            return self.server.url
        import ray

        port = self.server.url.rsplit(":", 1)[1]
        return f"http://{ray.util.get_node_ip_address()}:{port}"

    def stop(self) -> None:
        """Stop serving and flush the cache (its answers stay for the other servers)."""
        self.server.stop()
        if self.runtime.cache is not None:
            self.runtime.cache.close()


@dataclass
class Fleet:
    """Running servers, their URLs and the budget they share."""

    actors: list[Any]
    urls: list[str]
    budget: Any

    def spend(self) -> dict[str, Any]:
        """The shared budget's totals (calls, tokens, cost, refusals, the cap hit)."""
        import ray

        snapshot: dict[str, Any] = ray.get(self.budget.snapshot.remote())
        return snapshot

    def stop(self) -> None:
        """Stop every server, then end the actors and the budget."""
        import ray

        ray.get([a.stop.remote() for a in self.actors])
        for actor in [*self.actors, self.budget]:
            ray.kill(actor)


def start_env_servers(
    n: int, spec: FleetSpec, *, caps: dict[str, Any] | None = None, num_cpus: float = 0.5
) -> Fleet:
    """Start ``n`` servers on the connected Ray cluster and wait until all serve.

    Args:
        n: servers (Ray actors of ``num_cpus`` each).
        spec: what they serve.
        caps: budget caps shared by all of them (``max_cost_usd``, ``max_tokens``,
            ``max_calls``); none: the budget only counts.

    Returns:
        The fleet; ``fleet.urls`` in server order.

    Raises:
        ConfigError: seeds to derive tasks from, several servers and no shared cache.
    """
    import ray

    if n < 1:
        raise ValueError("a fleet needs at least one server")
    if spec.seeds is not None and spec.cache_dir is None and n > 1:
        raise ConfigError(
            "a fleet deriving tasks from seeds needs a shared cache_dir (else each of its "
            f"{n} servers pays for every derivation)",
            key_path="cache_dir",
        )
    name = "factory-simenv-budget-" + hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    budget = budget_actor(name, **(caps or {}))
    remote: Any = ray.remote(num_cpus=num_cpus)(EnvServer)
    actors = [remote.remote(spec, budget)]
    if spec.seeds is not None:
        # the first server derives the tasks and stores the answers in the shared cache;
        # the others start after it and read them there instead of paying n times
        ray.get(actors[0].url.remote())
    actors += [remote.remote(spec, budget) for _ in range(n - 1)]
    urls = ray.get([a.url.remote() for a in actors])
    return Fleet(actors, urls, budget)
