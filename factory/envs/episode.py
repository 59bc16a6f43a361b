"""What every domain's episode sampler shares: the conversation under construction, the
user cast for a scenario and the finished trajectory with its labels.

A domain sampler (``factory/envs/<domain>/sampler.py``) subclasses ``Episode`` with its
wording, its wrong calls and its scenarios; the turn bookkeeping, how a wrong call is
tried and recovered from, how an episode goes from scenario to follow-up
(:class:`ScenarioSampler`) and how the trajectory is labelled are written once here, so
the domains' episodes stay comparable (and the random draws in the same order).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from factory.core.delta import changed_size
from factory.core.labels import is_error_observation, trajectory_labels
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.envs.base import Environment

__all__ = [
    "RECOVER_SHARE",
    "TRANSFERRED",
    "Abort",
    "Episode",
    "ScenarioSampler",
    "cast_user",
    "episode_trajectory",
]

State = dict[str, Any]
Args = dict[str, Any]

RECOVER_SHARE = 0.75  # after a wrong call, the agent retries correctly; otherwise it gives up
#: tau-bench's closing line of a transfer to a human agent: the episode ends with it.
TRANSFERRED = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."


class Abort(Exception):
    """The agent gives up; the argument is its closing message."""


class Episode:
    """Turns, executed calls and bookkeeping of one conversation.

    Subclasses give ``wrong_calls`` (the domain's plausible mistakes for a call) and may
    change how often a call goes wrong (``mistake_chance``) and which mistake is made
    (``pick_mistake``).
    """

    def __init__(
        self, env: Environment, rng: random.Random, user_id: str, shares: tuple[float, float]
    ):
        self.env, self.rng, self.user_id = env, rng, user_id
        self.invalid_share, self.violation_share = shares
        self.profile: dict[str, Any] | None = None  # what get_user_details last returned
        self.turns: list[Turn] = []
        self.mistakes: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.calls = 0

    @property
    def state(self) -> State:
        return self.env.state

    def user(self, text: str) -> None:
        self.turns.append(Turn("user", text))

    def say(self, text: str) -> None:
        self.turns.append(Turn("assistant", text))

    def call(self, name: str, args: Args) -> str:
        call_id = f"call_{self.calls}"
        self.calls += 1
        self.turns.append(Turn("assistant", tool_calls=[ToolCall(name, args, call_id)]))
        observation = self.env.execute(name, args)
        self.turns.append(Turn("tool", observation, name=name, tool_call_id=call_id))
        return observation

    def wrong_calls(self, name: str, args: Args, cost: float) -> dict[str, Args]:
        """Wrong versions of the call ``name(args)``, by kind of mistake."""
        raise NotImplementedError

    def mistake_chance(self, name: str) -> float:
        return self.invalid_share

    def pick_mistake(self, wrong: Mapping[str, Args]) -> str:
        return self.rng.choice(sorted(wrong))

    def act(self, name: str, args: Args, *, cost: float = 0) -> str:
        """The intended call, possibly after a wrong one (``cost``: what a payment must cover).

        Raises:
            Abort: the wrong call failed and the agent gives up.
        """
        if self.rng.random() < self.mistake_chance(name):
            wrong = self.wrong_calls(name, args, cost)
            if wrong:
                kind = self.pick_mistake(wrong)
                step = self.calls
                observation = self.call(name, wrong[kind])
                accepted = not is_error_observation(observation)
                self.mistakes.append({"call": step, "kind": kind, "accepted": accepted})
                if accepted:  # the world took it (arguments not validated): do not act twice
                    return observation
                if self.rng.random() >= RECOVER_SHARE:
                    raise Abort(f"I'm sorry, but I could not complete that: {observation[7:]}.")
        return self.call(name, args)

    def violate(self, kind: str) -> bool:
        """Whether the agent breaks this policy rule now (recorded when it does)."""
        if self.rng.random() < self.violation_share:
            self.violations.append(kind)
            return True
        return False


def cast_user(
    state: State,
    rng: random.Random,
    scenario: str,
    fits: Callable[[State, str, str], bool],
    table: str = "users",
) -> tuple[str, str]:
    """A user (a record of ``table``) for the scenario: random draws, then a full scan,
    else ``browse``."""
    users = list(state[table])
    for _ in range(60):
        user_id = rng.choice(users)
        if fits(state, scenario, user_id):
            return scenario, user_id
    fitting = [u for u in users if fits(state, scenario, u)]
    return (scenario, rng.choice(fitting)) if fitting else ("browse", rng.choice(users))


def episode_trajectory(
    ep: Episode,
    start: Environment,
    *,
    system: str,
    tools: list[dict[str, Any]],
    env_id: str,
    task_id: str | None,
    played: list[str],
    write_tools: frozenset[str],
) -> Trajectory:
    """The finished episode as a canonical trajectory, labelled (outcome, |Δ| from the
    world ``start`` was forked from) and with its content id."""
    traj = Trajectory(
        system=system,
        tools=tools,
        turns=ep.turns,
        metadata={
            "source": f"sampler:{env_id}",
            "format": "sampler",
            "env_id": env_id,
            "task_id": task_id,
            "user_id": ep.user_id,
            "sampler": {"scenarios": played, "mistakes": ep.mistakes, "violations": ep.violations},
        },
    )
    size = changed_size(start.state, ep.env.state)
    traj.metadata["labels"] = trajectory_labels(traj, write_tools=write_tools, delta_size=size)
    traj.metadata["id"] = traj.content_id()
    return traj


E = TypeVar("E", bound=Episode)


@dataclass(frozen=True)
class ScenarioSampler(Generic[E]):
    """A domain's LLM-free episodes: its scenarios, and the walk every domain shares.

    An episode draws a scenario by weight, casts a user it fits (:func:`cast_user`), plays
    it, and with ``followup_share`` goes on with another request of the same user (at most
    ``max_requests`` in all), until a scenario ends the conversation (a transfer, an
    ``Abort``). The domain states the parts:

    * ``run``: scenario -> a function playing it on an ``Episode``, returning the agent's
      closing message;
    * ``weights``: scenario -> default weight; ``followups``: those a user may go on with;
    * ``fits(state, scenario, user_id)``: whether the user has what the scenario is about;
    * ``episode(env, rng, user_id, shares)``: the domain's ``Episode`` subclass;
    * ``system``, ``default_tools()`` and ``write_tools`` (for the labels);
    * ``users``: the table the episode's user is cast from;
    * ``may_follow(ep)`` and ``before_followup(ep)``: whether an episode may go on, and
      what the agent refreshes first (the airline re-reads the profile).
    """

    run: Mapping[str, Callable[[E], str]]
    weights: Mapping[str, float]
    followups: tuple[str, ...]
    fits: Callable[[State, str, str], bool]
    episode: Callable[[Environment, random.Random, str, tuple[float, float]], E]
    system: str
    default_tools: Callable[[], list[dict[str, Any]]]
    write_tools: Collection[str]
    users: str = "users"
    followup_share: float = 0.25
    max_requests: int = 3
    may_follow: Callable[[E], bool] = lambda ep: True
    before_followup: Callable[[E], None] = lambda ep: None

    def sample_episode(
        self,
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
        """Walk ``env`` through one episode and return it as a canonical trajectory.

        Args:
            env: a fresh fork of a world; it is stepped (it must validate arguments for
                wrong types to be refused).
            rng: the episode's only source of randomness.
            env_id: identity of the world (metadata and labels).
            invalid_share: chance that a call is first made wrongly.
            violation_share: chance that the agent breaks a policy rule the tools accept.
            task_id: provenance id of the episode.
            tools: tool specs of the trajectory (default ``default_tools()``).
            system: the system prompt (default ``system``).
            scenarios: scenario weights replacing ``weights``.

        Returns:
            The trajectory. Metadata: ``env_id``, ``task_id``, ``user_id``, ``labels``
            (with the episode's exact |Δ|), ``sampler`` (scenarios played, mistakes,
            violations), ``source``, ``format``, ``id``. The shares and weights are not
            checked here: ``factory.envsim.sampler`` checks them for every domain.
        """
        weights = self.weights if scenarios is None else scenarios
        start = env.copy()
        drawn = rng.choices(list(weights), weights=list(weights.values()))[0]
        scenario, user_id = cast_user(env.state, rng, drawn, self.fits, self.users)
        ep = self.episode(env, rng, user_id, (invalid_share, violation_share))
        played = [scenario]
        while True:
            try:
                closing = self.run[scenario](ep)
                ended = closing == TRANSFERRED
            except Abort as stop:
                closing, ended = str(stop.args[0]), True
            ep.say(closing)
            options = [s for s in self.followups if self.fits(ep.state, s, user_id)]
            if ended or not self.may_follow(ep) or len(played) == self.max_requests:
                break
            if not options or rng.random() >= self.followup_share:
                break
            scenario = rng.choice(options)
            played.append(scenario)
            self.before_followup(ep)
        return episode_trajectory(
            ep,
            start,
            system=self.system if system is None else system,
            tools=tools if tools is not None else self.default_tools(),
            env_id=env_id,
            task_id=task_id,
            played=played,
            write_tools=frozenset(self.write_tools),
        )
