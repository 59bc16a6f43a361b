"""What every domain's episode sampler shares: the conversation under construction, the
user cast for a scenario and the finished trajectory with its labels.

A domain sampler (``factory/envs/<domain>/sampler.py``) subclasses ``Episode`` with its
wording, its wrong calls and its scenarios; the turn bookkeeping, how a wrong call is
tried and recovered from, and how the trajectory is labelled are written once here, so
the domains' episodes stay comparable (and the random draws in the same order).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from factory.core.delta import changed_size
from factory.core.labels import is_error_observation, trajectory_labels
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.envs.base import Environment

__all__ = ["RECOVER_SHARE", "Abort", "Episode", "cast_user", "episode_trajectory"]

State = dict[str, Any]
Args = dict[str, Any]

RECOVER_SHARE = 0.75  # after a wrong call, the agent retries correctly; otherwise it gives up


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
    state: State, rng: random.Random, scenario: str, fits: Callable[[State, str, str], bool]
) -> tuple[str, str]:
    """A user for the scenario: random draws, then a full scan, else ``browse``."""
    users = list(state["users"])
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
