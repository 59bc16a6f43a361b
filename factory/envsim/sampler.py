"""The programmatic (LLM-free) sampler driver: episodes on forks of a generated world.

Why a driver apart from the scenarios: what an agent does in an episode is the
domain's business (``factory/envs/<domain>/``, the plug-in's ``sampler`` part:
its scenarios, their weights, its default tools); building the world once,
forking it per episode, numbering episodes so any one can be rebuilt alone,
and checking the knobs are the same for every domain.

Two knobs add calls a careful agent would not make (a domain's scenarios
decide how): ``invalid_share``, the chance that a call is first made wrongly
(the world answers ``Error: ...``), and ``violation_share``, the chance that
the agent breaks a policy rule the tools do not enforce.

Determinism: episode ``i`` of run ``seed`` uses ``random.Random(f"{seed}:{i}")``
on a fresh copy-on-write fork of the world, so any episode can be rebuilt
alone, and shards of a run produced anywhere, with identical bytes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

from factory.core.trajectory import Trajectory, canonical_json
from factory.envs.base import Environment
from factory.envs.plugin import EpisodeSampling
from factory.envs.registry import generate_environment, get_plugin
from factory.envsim.steps import StepSample, decompose
from factory.errors import ConfigError

__all__ = [
    "EpisodeSampler",
    "check_share",
    "sample_episode",
    "sample_episodes",
    "scenario_weights",
    "world_env_id",
]


def world_env_id(domain: str, world_seed: int, world_sizes: Mapping[str, Any] | None = None) -> str:
    """``<domain>-gen-<seed>``, plus a hash of the sizes when they are not the defaults."""
    base = f"{domain}-gen-{world_seed}"
    if not world_sizes:
        return base
    sizes = canonical_json({k: str(v) for k, v in world_sizes.items()})
    return f"{base}-{hashlib.sha256(sizes.encode()).hexdigest()[:8]}"


def check_share(name: str, value: float) -> None:
    """Raises ConfigError unless ``0 <= value <= 1`` (the key path is ``name``)."""
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be between 0 and 1, got {value!r}", key_path=name)


def scenario_weights(
    weights: Mapping[str, float] | None, defaults: Mapping[str, float]
) -> dict[str, float]:
    """The weights to draw scenarios with: ``defaults``, or ``weights`` over the same names.

    Raises:
        ConfigError: an unknown scenario name, a negative weight, or all weights 0.
    """
    if weights is None:
        return dict(defaults)
    unknown = sorted(set(weights) - set(defaults))
    if unknown:
        raise ConfigError(
            f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(defaults)}",
            key_path="scenarios",
        )
    if any(not w >= 0 for w in weights.values()) or not sum(weights.values()) > 0:
        raise ConfigError("scenario weights must be >= 0 and not all 0", key_path="scenarios")
    return {k: float(w) for k, w in weights.items() if w > 0}


def _sampling(domain: str) -> EpisodeSampling:
    sampling = get_plugin(domain, needs="sampler").sampler
    assert sampling is not None
    return sampling


def sample_episode(
    env: Environment,
    *,
    rng: random.Random,
    env_id: str,
    invalid_share: float = 0.2,
    violation_share: float = 0.05,
    task_id: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    system: str | None = None,
    scenarios: Mapping[str, float] | None = None,
) -> Trajectory:
    """Walk ``env`` through one episode of its domain's scenarios.

    Args:
        env: a fresh fork of a world; it is stepped. It must validate arguments
            for wrong types to be refused.
        rng: the episode's only source of randomness.
        env_id: identity of the world (metadata and labels).
        invalid_share: chance that a call is first made wrongly.
        violation_share: chance that the agent breaks a policy rule the tools accept.
        task_id: provenance id of the episode.
        tools: tool specs of the trajectory (default: the domain's bare specs).
        system: the system prompt (default: the domain's).
        scenarios: scenario weights replacing the domain's defaults.

    Returns:
        The trajectory; its metadata holds ``env_id``, ``task_id``, ``user_id``,
        ``labels`` (with the episode's exact |Δ|), ``sampler``, ``source``, ``id``.

    Raises:
        ConfigError: the domain has no sampler, a share is outside [0, 1], or
            bad scenario weights.
    """
    sampling = _sampling(env.domain)
    check_share("invalid_share", invalid_share)
    check_share("violation_share", violation_share)
    return sampling.sample_episode(
        env,
        rng=rng,
        env_id=env_id,
        invalid_share=invalid_share,
        violation_share=violation_share,
        task_id=task_id,
        tools=tools,
        system=sampling.system if system is None else system,
        scenarios=scenario_weights(scenarios, sampling.scenarios),
    )


def _world(
    domain: str, seed: int, sizes: Mapping[str, Any] | None, validate_arguments: bool
) -> Environment:
    """The generated world; ``validate_arguments=False`` only asked of a world that takes it.

    Why only then: the default (validate) is every executor's, so a domain whose
    environment has no such switch still runs with the default.
    """
    if validate_arguments:
        return generate_environment(domain, seed, sizes)
    try:
        return generate_environment(domain, seed, sizes, validate_arguments=False)
    except TypeError as exc:
        raise ConfigError(
            f"the {domain} environment has no validate_arguments switch ({exc})",
            key_path="envsim.validate_arguments",
        ) from None


class EpisodeSampler:
    """A generated world of ``domain``, built once, and episodes sampled on forks of it.

    Arguments are those of :func:`sample_episode`, plus the world's generator
    seed and sizes (the size keys the domain's plug-in declares), and
    ``validate_arguments``: whether the executor refuses a call whose arguments
    do not fit the tool's JSON Schema (``False``: it runs the call as the
    reference implementation does, e.g. tau-bench).

    Episode ``index`` of run ``seed`` depends on nothing else, so a run split
    into index ranges across workers gives the same episodes.

    Raises:
        ConfigError: an unknown domain or one without a sampler, an unknown
            ``world_sizes`` key, a share outside [0, 1] or bad scenario weights.
    """

    def __init__(
        self,
        domain: str,
        world_seed: int = 0,
        *,
        world_sizes: Mapping[str, Any] | None = None,
        invalid_share: float = 0.2,
        violation_share: float = 0.05,
        tools: list[dict[str, Any]] | None = None,
        system: str | None = None,
        scenarios: Mapping[str, float] | None = None,
        validate_arguments: bool = True,
    ):
        sampling = _sampling(domain)
        check_share("invalid_share", invalid_share)
        check_share("violation_share", violation_share)
        self.domain = domain
        self._play = sampling.sample_episode
        self.scenarios = scenario_weights(scenarios, sampling.scenarios)
        self.world = _world(domain, world_seed, world_sizes, validate_arguments)
        self.env_id = world_env_id(domain, world_seed, world_sizes)
        self.invalid_share, self.violation_share = invalid_share, violation_share
        self.tools = tools if tools is not None else sampling.default_tools()
        self.system = sampling.system if system is None else system

    def fresh_env(self) -> Environment:
        """A fork of the pristine world (copy-on-write where the domain supports it)."""
        return self.world.copy()

    def episode(self, index: int, *, seed: int) -> Trajectory:
        """Episode ``index`` of run ``seed``."""
        return self._play(
            self.fresh_env(),
            rng=random.Random(f"{seed}:{index}"),
            env_id=self.env_id,
            invalid_share=self.invalid_share,
            violation_share=self.violation_share,
            task_id=f"{self.env_id}/{seed}/{index}",
            tools=self.tools,
            system=self.system,
            scenarios=self.scenarios,
        )

    def episodes(self, n: int, *, seed: int, start: int = 0) -> Iterator[Trajectory]:
        """Episodes ``start`` to ``start + n - 1`` of run ``seed``."""
        for index in range(start, start + n):
            yield self.episode(index, seed=seed)

    def steps(
        self, n: int, *, seed: int, start: int = 0, check: bool = False
    ) -> Iterator[StepSample]:
        """The step samples of :meth:`episodes`, each episode replayed on a fresh fork."""
        for traj in self.episodes(n, seed=seed, start=start):
            yield from decompose(traj, self.fresh_env(), env_id=self.env_id, check=check)


def sample_episodes(
    domain: str,
    world_seed: int,
    n: int,
    *,
    seed: int,
    invalid_share: float = 0.2,
    violation_share: float = 0.05,
    world_sizes: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Iterator[Trajectory]:
    """``n`` episodes of run ``seed`` on forks of the world ``(world_seed, world_sizes)``."""
    sampler = EpisodeSampler(
        domain,
        world_seed,
        world_sizes=world_sizes,
        invalid_share=invalid_share,
        violation_share=violation_share,
        tools=tools,
    )
    yield from sampler.episodes(n, seed=seed)
